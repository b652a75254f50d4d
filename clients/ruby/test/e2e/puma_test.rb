# frozen_string_literal: true

# End to end: a real Puma in cluster mode (preload_app!, 4 workers) running
# a Rack app with Action Cable mounted (config.ru, puma.rb), WebSocket
# clients subscribed through every worker, broadcasts from outside the
# Puma. With `adapter: listenhub` the whole Puma holds one LISTEN backend
# (the hub's); with `adapter: postgresql`, in the same test against the
# same database, one per worker. The hub SIGKILLed: the clients keep
# receiving through the workers' own connections; the hub restarted: the
# workers fail back and the census returns to one. A hub client made in
# the master before the fork fails at once in a worker, naming fork.
require_relative "../rails/test_helper"
require_relative "websocket"

class PumaEndToEndTest < Minitest::Test
  WORKERS = 4
  IDENTIFIER = JSON.generate({ "channel" => "RoomChannel" })
  LOCAL_ID = "lhrb-puma-local"

  def setup
    LHTest.require_env(self)
    @bin = ENV["LISTENHUB_PUMA"] || "puma"
    found = system("command -v #{@bin} >/dev/null 2>&1")
    unless found
      msg = "puma is not installed (Debian: apt-get install puma)"
      flunk("#{msg} (CI=true: not skipping)") if ENV["CI"] == "true"
      skip msg
    end
    @dir = Dir.mktmpdir("lhrb-puma-")
    File.chmod(0o700, @dir)
    @cleanups = []
    LHRails.establish
  end

  def teardown
    puts "puma log:\n#{File.read(@logs)}" if @logs && !passed? && File.exist?(@logs)
    @cleanups&.reverse_each do |c|
      c.call
    rescue StandardError => e
      warn "cleanup: #{e.class}: #{e.message}"
    end
    FileUtils.rm_rf(@dir) if @dir
    ActiveRecord::Base.clear_all_connections!
  end

  def count(sql)
    ActiveRecord::Base.connection.select_value(sql).to_i
  end

  def app_backends(name)
    count("SELECT count(*) FROM pg_stat_activity WHERE application_name = #{ActiveRecord::Base.connection.quote(name)}")
  end

  def actioncable_backends
    count("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'ActionCable-PID-%'")
  end

  def start_puma(adapter, hub_socket = nil)
    sock = File.join(@dir, "puma-#{adapter}.sock")
    pidfile = File.join(@dir, "puma-#{adapter}.pid")
    log = File.join(@dir, "puma-#{adapter}.log")
    lib = File.expand_path("../../lib", __dir__)
    env = LHTest.clean_env.merge(
      "CABLE_ADAPTER" => adapter, "PUMA_SOCKET" => sock, "PUMA_PIDFILE" => pidfile,
      "LHTEST_DATABASE_URL" => LHTest::DATABASE_URL, "CABLE_LOCAL_ID" => LOCAL_ID,
      "RUBYLIB" => [lib, ENV["RUBYLIB"]].compact.join(":")
    )
    env["LISTENHUB_SOCKET"] = hub_socket if hub_socket
    pid = Process.spawn(env, @bin, "-C", File.join(__dir__, "puma.rb"), File.join(__dir__, "config.ru"),
                        out: log, err: %i[child out], pgroup: true, unsetenv_others: true)
    stop = lambda do
      begin
        Process.kill(:TERM, pid)
        Timeout.timeout(15) { Process.wait(pid) }
      rescue Timeout::Error
        Process.kill(:KILL, -pid)
        Process.wait(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
      begin
        Process.kill(:KILL, -pid) # leftover workers
      rescue Errno::ESRCH
        nil
      end
    end
    @cleanups << stop
    @logs = log
    LHTest.wait_for("puma accepting on #{sock}") do
      if Process.waitpid(pid, Process::WNOHANG)
        flunk("puma exited early:\n#{File.read(log)}")
      end
      File.socket?(sock) && begin
        UNIXSocket.new(sock).close
        true
      rescue SystemCallError
        false
      end
    end
    [sock, stop]
  end

  # WebSocket clients subscribed to RoomChannel until every worker serves
  # at least two; returns them with the pid of their worker.
  def subscribe_through_every_worker(sock)
    clients = []
    workers = Hash.new(0)
    deadline = Listenhub.monotonic + LHTest::TIMEOUT * 2
    until workers.size == WORKERS && workers.values.all? { |n| n >= 2 }
      flunk("clients reached only workers #{workers.inspect}:\n#{File.read(@logs)}") if Listenhub.monotonic > deadline

      ws = WSClient.new(sock)
      @cleanups << -> { ws.close }
      ws.next_message(LHTest::TIMEOUT) { |m| m["type"] == "welcome" }
      ws.send_json({ "command" => "subscribe", "identifier" => IDENTIFIER })
      pid = ws.next_message(LHTest::TIMEOUT) { |m| m["message"].is_a?(Hash) && m["message"]["worker"] }["message"]["worker"]
      ws.next_message(LHTest::TIMEOUT) { |m| m["type"] == "confirm_subscription" }
      workers[pid] += 1
      clients << ws
    end
    [clients, workers]
  end

  # Every client receives broadcast n. repeat: the broadcast is sent again
  # every 200 ms until all have it (right after a failover a worker's own
  # connection may be counted before its LISTEN ran).
  def assert_all_receive(clients, tx, n, repeat: false)
    payload = ActiveSupport::JSON.encode({ "n" => n }) # as ActionCable.server.broadcast does
    tx.broadcast("room", payload)
    stop = false
    again = repeat ? Thread.new do
      until stop
        sleep 0.2
        tx.broadcast("room", payload) unless stop
      end
    end : nil
    clients.each do |ws|
      m = ws.next_message(LHTest::TIMEOUT) { |x| x["identifier"] == IDENTIFIER && x["message"].is_a?(Hash) && x["message"]["n"] == n }
      assert_equal n, m["message"]["n"]
    end
  ensure
    stop = true
    again&.join
  end

  def http_get(sock, path)
    s = UNIXSocket.new(sock)
    s.write("GET #{path} HTTP/1.0\r\nHost: localhost\r\n\r\n")
    resp = Timeout.timeout(LHTest::TIMEOUT) { s.read }
    s.close
    resp.split("\r\n\r\n", 2)[1].to_s
  end

  def broadcaster(adapter)
    server = ActionCable::Server::Base.new(config: ActionCable::Server::Configuration.new)
    server.config.cable = { "adapter" => adapter, "socket" => File.join(@dir, "unused.sock") }
    server.config.logger = Logger.new(nil)
    server.config.pubsub_adapter.new(server)
  end

  def test_one_listen_backend_for_the_whole_puma
    h = LHTest::Hub.new("puma", dir: Dir.mktmpdir("lhrb-hub-", @dir))
    @cleanups << -> { h.close }
    tx = broadcaster("listenhub") # NOTIFY through Active Record, outside the Puma
    census = {}

    # adapter: listenhub.
    sock, stop = start_puma("listenhub", h.socket)
    clients, workers = subscribe_through_every_worker(sock)
    assert_equal WORKERS, workers.size
    assert_all_receive(clients, tx, 1)
    census[:listenhub] = app_backends(h.app) + app_backends(LOCAL_ID) + actioncable_backends
    assert_equal 1, app_backends(h.app)
    assert_equal 1, census[:listenhub], "LISTEN backends for the whole Puma"

    # A hub client made in the master before the fork fails at once in a
    # worker, naming fork.
    body = http_get(sock, "/client")
    assert body.start_with?("Listenhub::ForkedError "), body
    assert_operator body.split[1].to_f, :<, 1.0, body
    assert_includes body, "before fork()"

    # The hub SIGKILLed: every worker LISTENs on its own connection.
    h.kill
    LHTest.wait_for("every worker on its own LISTEN connection") { app_backends(LOCAL_ID) == WORKERS }
    census[:hub_down] = app_backends(LOCAL_ID)
    assert_all_receive(clients, tx, 2, repeat: true)

    # The hub back: the workers fail back, the census returns to one.
    h.start
    LHTest.wait_for("the workers back on the hub") { app_backends(LOCAL_ID).zero? }
    assert_equal 1, app_backends(h.app)
    census[:hub_back] = app_backends(h.app) + app_backends(LOCAL_ID)
    assert_all_receive(clients, tx, 3)
    clients.each(&:close)
    stop.call

    # adapter: postgresql, the same app and database.
    sock, stop = start_puma("postgresql")
    clients, = subscribe_through_every_worker(sock)
    assert_all_receive(clients, broadcaster("postgresql"), 4)
    census[:postgresql] = actioncable_backends
    assert_equal WORKERS, census[:postgresql], "the postgresql adapter: one LISTEN backend per worker"
    clients.each(&:close)
    stop.call

    puts format("census (Puma, %d workers, preload_app!): adapter: postgresql %d LISTEN backends; " \
                "adapter: listenhub %d (the hub's); hub SIGKILLed: %d (each worker's own); hub restarted: %d",
                WORKERS, census[:postgresql], census[:listenhub], census[:hub_down], census[:hub_back])
  end
end
