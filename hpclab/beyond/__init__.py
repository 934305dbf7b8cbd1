"""Beyond data parallelism (notebook 08), on hpclab.ddp's MLP and kernels: ZeRO-1 (:mod:`.zero`), a tensor-parallel
dense layer (:mod:`.tensor`), pipeline stages and their bubble (:mod:`.pipeline`), checks (:mod:`.check`)."""
