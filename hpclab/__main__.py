from hpclab.cli import main

raise SystemExit(main())
