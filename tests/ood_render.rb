# Renders an Open OnDemand app's ERB file as the dashboard does: submit.yml.erb sees the form's attributes as
# names, template/*.erb see them as `context`, view.html.erb sees the session's host, port and password.
#   ruby tests/ood_render.rb FILE '{"gpus": 4, ...}'   -> the rendered text on stdout
require "erb"
require "json"
require "ostruct"
file, values = ARGV[0], JSON.parse(ARGV[1])
names = values.merge("context" => OpenStruct.new(values))
print ERB.new(File.read(file), trim_mode: "-").result_with_hash(names)
