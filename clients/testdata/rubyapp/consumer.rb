# frozen_string_literal: true

# The gem as an app uses it once installed: ruby consumer.rb SOCKET Q
# NO_HUB_SOCKET DATABASE_URL. The hub client, then a Failover without a hub
# (local mode), then Action Cable finding `adapter: listenhub` by name.
# Run by go test ./clients/ (TestRubyPackage) with the gem installed into a
# GEM_PATH of its own; each step waits for a real wake (the test NOTIFYs Q
# every 50 ms).
gem "listenhub"
require "listenhub"
require "timeout"

sock, q, no_hub, url = ARGV
spec = Gem.loaded_specs.fetch("listenhub")
abort "listenhub loaded from #{$LOADED_FEATURES.grep(/listenhub\.rb$/).inspect}, not the installed gem #{spec.full_gem_path}" unless $LOADED_FEATURES.any? { |f| f.start_with?(spec.full_gem_path) && f.end_with?("/listenhub.rb") }
puts "listenhub #{Listenhub::VERSION} from #{spec.full_gem_path}"

wakes = Queue.new
c = Listenhub.connect(sock, on_wake: ->(w) { wakes << w })
c.subscribe(q)
w = Timeout.timeout(10) { wakes.pop }
puts "hub: #{w.name} #{w.payload.inspect}"
c.close

wakes = Queue.new
f = Listenhub::Failover.new(no_hub, database_url: url, on_wake: ->(x) { wakes << x unless x.durable? })
raise "want local mode without a hub, got #{f.mode}" unless f.mode == :local

f.subscribe(q)
w = Timeout.timeout(10) { wakes.pop }
puts "local: #{w.name} #{w.payload.inspect}"
f.close

require "active_support/core_ext/string/inflections" # what Rails has loaded before Action Cable configures
require "action_cable"
server = ActionCable::Server::Base.new(config: ActionCable::Server::Configuration.new)
server.config.cable = { "adapter" => "listenhub", "socket" => sock }
server.config.logger = Logger.new(nil)
klass = server.config.pubsub_adapter
raise "adapter: listenhub found #{klass}" unless klass.name == "ActionCable::SubscriptionAdapter::Listenhub"

puts "cable.yml adapter: listenhub -> #{klass}"
