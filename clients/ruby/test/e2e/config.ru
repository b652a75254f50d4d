# frozen_string_literal: true

# A minimal Rack app with Action Cable mounted, for the Puma end-to-end
# test: one channel that streams "room" and tells its client the pid of the
# Puma worker serving it. The adapter comes from CABLE_ADAPTER (listenhub or
# postgresql); the database from LHTEST_DATABASE_URL.
require "logger"
require "pg"
require "action_cable"
require "active_record"

kv = PG::Connection.conninfo_parse(ENV.fetch("LHTEST_DATABASE_URL")).each_with_object({}) { |o, h| h[o[:keyword]] = o[:val] if o[:val] }
ActiveRecord::Base.establish_connection(
  { adapter: "postgresql", host: kv["host"], port: kv["port"], database: kv["dbname"], username: kv["user"],
    password: kv["password"], sslmode: kv["sslmode"], pool: 16 }.compact
)

module ApplicationCable
  class Connection < ActionCable::Connection::Base; end
  class Channel < ActionCable::Channel::Base; end
end

class RoomChannel < ApplicationCable::Channel
  def subscribed
    stream_from "room"
    transmit({ "worker" => Process.pid })
  end
end

cable = { "adapter" => ENV.fetch("CABLE_ADAPTER") }
if cable["adapter"] == "listenhub"
  cable.merge!("socket" => ENV.fetch("LISTENHUB_SOCKET"), "id" => ENV.fetch("CABLE_LOCAL_ID"),
               "min_local" => 0.5, "probe_interval" => 0.2, "probe_max_interval" => 0.5)
end
ActionCable.server.config.cable = cable
ActionCable.server.config.logger = Logger.new($stderr, level: Logger::WARN)
ActionCable.server.config.connection_class = -> { ApplicationCable::Connection }
ActionCable.server.config.disable_request_forgery_protection = true
ActionCable.server.config.worker_pool_size = 4
# The adapter is made here, in the master, before Puma forks the workers
# (preload_app!): each worker must get a listener of its own.
ActionCable.server.pubsub
ActiveRecord::Base.connection_pool.disconnect!

# A hub client made in the master, before the fork: in a worker every call
# must fail at once with an error that names fork (never hang, never write
# on the master's socket).
if cable["adapter"] == "listenhub"
  require "listenhub"
  MASTER_CLIENT = Listenhub.connect(ENV.fetch("LISTENHUB_SOCKET"))
  MASTER_CLIENT.subscribe("master")
end

map("/cable") { run ActionCable.server }
map("/client") do
  run(lambda do |_env|
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    body = begin
      MASTER_CLIENT.subscribe("in-worker", timeout: 5)
      "no error"
    rescue StandardError => e
      "#{e.class} #{format('%.3f', Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0)} #{e.message}"
    end
    [200, { "Content-Type" => "text/plain" }, [body]]
  end)
end
map("/pid") { run ->(_env) { [200, { "Content-Type" => "text/plain" }, [Process.pid.to_s]] } }
