# frozen_string_literal: true

# Test helpers: a real `listenhub serve` per test, NOTIFY through pg, a fake
# hub for what a healthy hub never does, and waiting with deadlines.
#
# Run by clients/clients_test.go (go test ./clients/), which builds the hub
# and starts a throwaway Postgres, with
#   LHTEST_HUB_BIN        the listenhub binary
#   LHTEST_DATABASE_URL   the database
# Both are required; see clients/ruby/README.md to run these by hand.

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "minitest/autorun"
require "fileutils"
require "tmpdir"
require "timeout"
require "monitor"
require "pg"
require "listenhub"

module LHTest
  HUB_BIN = ENV.fetch("LHTEST_HUB_BIN", "")
  DATABASE_URL = ENV.fetch("LHTEST_DATABASE_URL", "")
  # Generous: the CI machine is shared and loaded.
  TIMEOUT = 20.0

  module_function

  def require_env(test)
    return unless HUB_BIN.empty? || DATABASE_URL.empty?

    test.skip("LHTEST_HUB_BIN and LHTEST_DATABASE_URL are not set (run go test ./clients/)")
  end

  # Polls the block until true; fails naming what after timeout.
  def wait_for(what, timeout = TIMEOUT)
    deadline = Listenhub.monotonic + timeout
    interval = 0.001
    until yield
      raise Minitest::Assertion, "timed out after #{timeout}s waiting for #{what}" if Listenhub.monotonic > deadline

      sleep interval
      interval = [interval * 2, 0.02].min
    end
  end

  # Runs the block in a forked child and returns the string it returned,
  # or "Class: message" of what it raised.
  def in_child
    r, w = IO.pipe
    pid = fork do
      r.close
      out = begin
        yield
      rescue Exception => e # rubocop:disable Lint/RescueException
        "#{e.class}: #{e.message}"
      end
      w.write(out)
      w.close
      exit!(0)
    end
    w.close
    out = r.read
    r.close
    _, status = Process.wait2(pid)
    # A child that died before its block returned says how.
    out.empty? && !status.success? ? "child died: #{status.inspect}" : out
  end

  def clean_env
    ENV.to_h.reject { |k, _| k.start_with?("LISTENHUB_", "PG") || k == "DATABASE_URL" }
  end

  # One `listenhub serve` on its own socket in a temporary directory.
  class Hub
    attr_reader :socket, :dir, :app, :prefix, :suffix, :pid

    # ready: false returns once the socket exists, for a hub whose
    # Postgres is down (it never says healthy).
    def initialize(name, prefix: "", suffix: "", socket: nil, args: [], dir: nil, ready: true)
      @own_dir = dir.nil?
      @dir = dir || Dir.mktmpdir("lhrb-")
      @socket = socket || File.join(@dir, "hub.sock")
      @app = "lhrb-#{name}"[0, 60]
      @prefix = prefix
      @suffix = suffix
      @args = args
      @log = File.join(@dir, "hub-#{Process.pid}-#{object_id}.log")
      @wait_ready = ready
      start
    end

    def start
      argv = [HUB_BIN, "serve", "--socket", @socket, "--database-url", DATABASE_URL,
              "--application-name", @app, "--status-interval", "200ms", "--log-level", "debug"]
      argv += ["--channel-prefix", @prefix] unless @prefix.empty?
      argv += ["--channel-suffix", @suffix] unless @suffix.empty?
      argv += @args
      @pid = Process.spawn(LHTest.clean_env, *argv, out: [@log, "a"], err: %i[child out], unsetenv_others: true)
      if @wait_ready
        ready
      else
        LHTest.wait_for("the hub's socket") { File.socket?(@socket) }
      end
      self
    end

    # Connects and reads until a status healthy:true (the hub accepts before
    # its Postgres connection is up and then says false).
    def ready
      deadline = Listenhub.monotonic + TIMEOUT
      loop do
        if Process.waitpid(@pid, Process::WNOHANG)
          @pid = nil
          raise Minitest::Assertion, "listenhub exited early:\n#{output}"
        end
        return if healthy?(deadline)
        raise Minitest::Assertion, "listenhub not ready:\n#{output}" if Listenhub.monotonic > deadline

        sleep 0.01
      end
    end

    def healthy?(deadline)
      s = Socket.unix(@socket)
      dec = Listenhub::Frame::Decoder.new
      loop do
        left = deadline - Listenhub.monotonic
        return false unless left.positive? && s.wait_readable(left)

        dec.feed(s.readpartial(65_536))
        while (m = dec.next_message)
          return true if m["t"] == "status" && m["healthy"] == true
        end
      end
    rescue SystemCallError, IOError
      false
    ensure
      s&.close
    end

    def output
      File.exist?(@log) ? File.read(@log) : ""
    end

    def channel(q)
      @prefix + q + @suffix
    end

    # SIGKILL: workers see EOF, nothing is cleaned up (the socket file
    # stays, stale).
    def kill
      return unless @pid

      Process.kill(:KILL, @pid)
      Process.wait(@pid)
      @pid = nil
    end

    def close
      kill
      FileUtils.rm_rf(@dir) if @own_dir
      FileUtils.rm_f(@log)
    end
  end

  # A pg connection for NOTIFY and pg_stat_activity.
  class DB
    attr_reader :conn

    def initialize
      @conn = PG.connect(DATABASE_URL)
      @conn.exec("SET application_name = 'lhrb-test'")
      @conn.exec("SET client_min_messages = warning")
    end

    def notify(channel, payload = "")
      @conn.exec_params("SELECT pg_notify($1, $2)", [channel, payload])
    end

    def backends(application_name)
      @conn.exec_params("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                        [application_name]).getvalue(0, 0).to_i
    end

    def close
      @conn.close
    end
  end

  # Records what a listener delivers.
  class Collector
    attr_reader :wakes, :statuses

    def initialize
      @mu = Monitor.new
      @cv = @mu.new_cond
      @wakes = []
      @statuses = []
    end

    def on_wake
      ->(w) { @mu.synchronize { @wakes << w; @cv.broadcast } }
    end

    def on_status
      ->(h) { @mu.synchronize { @statuses << h; @cv.broadcast } }
    end

    def wait(what, timeout = TIMEOUT)
      deadline = Listenhub.monotonic + timeout
      @mu.synchronize do
        until yield(self)
          left = deadline - Listenhub.monotonic
          if left <= 0
            raise Minitest::Assertion, "timed out after #{timeout}s waiting for #{what}; " \
                                       "wakes #{@wakes.last(20).inspect} statuses #{@statuses.inspect}"
          end
          @cv.wait(left)
        end
      end
    end

    def count(w)
      @mu.synchronize { @wakes.count(w) }
    end

    def include?(w)
      @mu.synchronize { @wakes.include?(w) }
    end

    def payloads(q)
      @mu.synchronize { @wakes.select { |w| w.name == q }.map(&:payload) }
    end
  end

  # A socket that speaks the protocol badly on purpose: a healthy status,
  # then every sub answered with nothing (:silent), a nack that is not about
  # the name (:nack), an ack (:ack); or never read (:deaf); or half a frame
  # then nothing (:partial); or the connection refused (:refuse).
  class FakeHub
    attr_reader :socket, :dir, :subs

    def initialize(mode, dir: nil)
      @own_dir = dir.nil?
      @dir = dir || Dir.mktmpdir("lhrb-fake-")
      @socket = File.join(@dir, "fake.sock")
      @mode = mode
      @subs = Queue.new
      @srv = UNIXServer.new(@socket)
      @conns = []
      @stop = false
      @thread = Thread.new { accept_loop }
    end

    def accept_loop
      until @stop
        c = @srv.accept
        @conns << c
        Thread.new { serve(c) }
      end
    rescue IOError, SystemCallError
      nil
    end

    def serve(c)
      if @mode == :refuse
        c.write(Listenhub::Frame.encode({ "t" => "nack", "q" => "", "error" => "uid 1000 is not allowed (--allow-uid)" }))
        return
      end
      c.write(Listenhub::Frame.encode({ "t" => "status", "healthy" => true }))
      c.write(Listenhub::Frame.encode({ "t" => "wake", "q" => "a", "p" => "x" })[0, 7]) if @mode == :partial
      if %i[deaf partial].include?(@mode)
        sleep 0.05 until @stop
        return
      end
      dec = Listenhub::Frame::Decoder.new
      loop do
        dec.feed(c.readpartial(65_536))
        while (m = dec.next_message)
          next unless m["t"] == "sub"

          @subs << m["q"]
          case @mode
          when :ack then c.write(Listenhub::Frame.encode({ "t" => "ack", "q" => m["q"] }))
          when :nack
            c.write(Listenhub::Frame.encode({ "t" => "nack", "q" => m["q"],
                                              "error" => "LISTEN failed: listener: no connection within the command timeout" }))
          end
        end
      end
    rescue IOError, SystemCallError
      nil
    end

    def close
      @stop = true
      @srv.close rescue nil # rubocop:disable Style/RescueModifier
      @conns.each { |c| c.close rescue nil } # rubocop:disable Style/RescueModifier
      FileUtils.rm_rf(@dir) if @own_dir
    end
  end
end

# Base class: a hub and a DB per test, closed afterwards.
class LHTestCase < Minitest::Test
  include LHTest

  def setup
    LHTest.require_env(self)
    @cleanups = []
  end

  def teardown
    @cleanups.reverse_each do |c|
      c.call
    rescue StandardError => e
      warn "cleanup: #{e.class}: #{e.message}"
    end
  end

  def cleanup(&blk)
    @cleanups << blk
  end

  def hub(**opts)
    h = Hub.new(name.delete_prefix("test_"), **opts)
    cleanup do
      puts "hub log:\n#{h.output}" unless passed? || h.output.empty?
      h.close
    end
    h
  end

  # A fake hub in mode and a client of it (connect options: opts), both
  # closed at cleanup.
  def fake_client(mode, **opts)
    f = FakeHub.new(mode)
    cleanup { f.close }
    c = Listenhub.connect(f.socket, **opts)
    cleanup { c.close }
    [f, c]
  end

  # A socket path in a new sticky, world-writable directory (like /tmp)
  # with a Ruby listener on it that runs as nobody (accept: the Ruby code
  # run after the bind, s the server), killed at cleanup.
  def listener_of_nobody(name, accept, ruby_args: [])
    d = tmpdir
    File.chmod(0o1777, d)
    path = File.join(d, name)
    code = "require \"socket\"; s = UNIXServer.new(ARGV[0]); $stdout.puts \"ready\"; $stdout.flush; #{accept}"
    io = IO.popen(["runuser", "-u", "nobody", "--", RbConfig.ruby, *ruby_args, "-e", code, path], "r", pgroup: true)
    cleanup do
      Process.kill(:KILL, -io.pid) # runuser and the ruby it runs
      io.close
    end
    assert_equal "ready\n", io.gets
    path
  end

  def db
    @db ||= DB.new.tap { |d| cleanup { d.close } }
  end

  def tmpdir
    d = Dir.mktmpdir("lhrb-")
    cleanup { FileUtils.rm_rf(d) }
    d
  end
end
