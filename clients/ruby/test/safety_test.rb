# frozen_string_literal: true

# The peer checks on the socket path and its directory, and fork safety.
require_relative "test_helper"
require "open3"
require "rbconfig"

class SafetyTest < LHTestCase
  def fake(mode, dir: nil)
    f = FakeHub.new(mode, dir: dir)
    cleanup { f.close }
    f
  end

  def refused(path, why, **opts)
    err = assert_raises(Listenhub::ConnError) { Listenhub.connect(path, **opts) }
    assert_equal "peer", err.op, err.message
    assert_includes err.message, why
  end

  def test_missing_directory_says_install
    path = File.join(tmpdir, "missing", "hub.sock")
    err = assert_raises(Listenhub::ConnError) { Listenhub.connect(path) }
    assert_equal "dial", err.op, err.message
    assert_includes err.message, "install -d -m 0755 #{File.dirname(path)}"
  end

  def test_symlink_to_a_real_socket_is_refused
    f = fake(:ack)
    link = File.join(f.dir, "link.sock")
    File.symlink(f.socket, link)
    refused(link, "a symlink")
  end

  def test_a_file_is_not_a_socket
    d = tmpdir
    File.write(File.join(d, "hub.sock"), "")
    refused(File.join(d, "hub.sock"), "not a socket")
  end

  # Every directory up to / counts: one above the socket's that another
  # user can write to lets them swap the socket's directory.
  def test_directory_above_writable_by_others_is_refused
    top = tmpdir
    d = File.join(top, "run")
    Dir.mkdir(d, 0o700)
    f = fake(:ack, dir: d)
    File.chmod(0o777, top)
    refused(f.socket, "#{top} above the socket: directory mode 0777 is writable by group or other")
    refused(f.socket, "chmod go-w #{top}")
  end

  # A uid that may not search the way to the socket gets the fix, not a
  # bare "permission denied" (run as nobody: root may search anything).
  def test_unreachable_directory_names_the_permission
    skip "needs root and runuser to run a client as nobody" unless Process.uid.zero? && system("which runuser > /dev/null")
    top = tmpdir # 0700, root's
    sock = File.join(top, "run", "hub.sock")
    lib = File.expand_path("../lib", __dir__)
    code = "require 'listenhub'; begin; Listenhub.connect(#{sock.inspect}); rescue Listenhub::ConnError => e; puts e.message; end"
    out, err, = Open3.capture3("runuser", "-u", "nobody", "--", RbConfig.ruby, "-I", lib, "-e", code)
    assert_match(/may not reach the socket/, out, err)
    assert_match(/search \(x\) permission/, out)
  end

  def test_directory_writable_by_group_or_other_is_refused
    d = tmpdir
    f = fake(:ack, dir: d)
    File.chmod(0o777, d)
    refused(f.socket, "writable by group or other")
    File.chmod(0o700, d)
    Listenhub.connect(f.socket).close
  end

  def test_sticky_directory_is_accepted
    d = tmpdir
    f = fake(:ack, dir: d)
    File.chmod(0o1777, d)
    c = Listenhub.connect(f.socket)
    c.subscribe("x")
    c.close
  end

  def test_directory_of_another_owner_is_refused
    skip "needs root to chown" unless Process.uid.zero?
    d = tmpdir
    f = fake(:ack, dir: d)
    File.chown(65_534, nil, d)
    refused(f.socket, "directory owned by uid 65534")
    Listenhub.connect(f.socket, allowed_uids: [65_534]).close # naming the uid trusts it
  end

  # A listener bound by another user in a sticky directory (like /tmp): the
  # directory passes, the socket's owner and the peer do not.
  def test_peer_of_another_user_is_refused
    skip "needs root to run a fake hub as another user" unless Process.uid.zero?
    path = listener_of_nobody("other.sock", 'c = s.accept; c.write([0].pack("N")) rescue nil; sleep 30',
                              ruby_args: ["-rrbconfig"])
    refused(path, "socket owned by uid 65534")
    # Past the file checks (the owner trusted by name), SO_PEERCRED still
    # sees nobody only if nobody is not trusted: trusting it lets it through.
    Listenhub.connect(path, allowed_uids: [65_534]).close
  end

  def test_peer_credentials_are_checked
    skip "needs root to bind as another user" unless Process.uid.zero?
    # The socket file is ours (chowned back), the listener runs as nobody:
    # only SO_PEERCRED tells.
    path = listener_of_nobody("peer.sock", "loop { s.accept }")
    File.lchown(0, 0, path)
    refused(path, "peer pid")
  end

  def test_client_made_before_fork_raises_in_the_child
    f = fake(:ack)
    c = Listenhub.connect(f.socket)
    cleanup { c.close }
    c.subscribe("parent")
    out = LHTest.in_child do
      t0 = Listenhub.monotonic
      c.subscribe("child", timeout: 5)
      "no error"
    rescue Listenhub::ForkedError => e
      format("ForkedError %.3f %s", Listenhub.monotonic - t0, e.message)
    end
    assert out.start_with?("ForkedError "), out
    assert_operator out.split[1].to_f, :<, 1.0, out
    assert_includes out, "before fork()"
    # The parent's connection was not cut by the child.
    c.subscribe("after")
    assert_nil c.err
    assert_equal "parent", f.subs.pop
    assert_equal "after", f.subs.pop, "the child sent a frame on the parent's connection"
  end

  def test_failover_made_before_fork_raises_in_the_child_and_leaves_the_parent_alone
    h = hub
    col = Collector.new
    fo = Listenhub::Failover.new(h.socket, database_url: DATABASE_URL, on_wake: col.on_wake)
    cleanup { fo.close }
    fo.subscribe("forked")
    pid = fork do
      code = begin
        fo.subscribe("child")
        1
      rescue Listenhub::ForkedError
        fo.close # in the child: closes its copies only
        0
      end
      exit!(code)
    end
    Process.wait(pid)
    assert_equal 0, $CHILD_STATUS&.exitstatus || $?.exitstatus # rubocop:disable Style/SpecialGlobalVars
    db.notify("forked", "still here")
    col.wait("the parent's wake after the child closed") { |s| s.payloads("forked") == ["still here"] }
    assert_equal :hub, fo.mode
  end

  # A Puma-like master with a fallback (local) connection forks a worker
  # that exits without ever subscribing: the child let go of the master's
  # Postgres socket at the fork, so its exit (finalizers and all) sends no
  # Terminate on it, and the master's session lives on and delivers.
  def test_child_exit_leaves_the_parents_fallback_session_alive
    app = "lhrb-fork-#{Process.pid}"
    col = Collector.new
    absent = File.join(Dir.tmpdir, "lhrb-absent-#{Process.pid}.sock")
    fo = Listenhub::Failover.new(absent, database_url: DATABASE_URL, application_name: app, on_wake: col.on_wake)
    cleanup { fo.close }
    fo.subscribe("forkwake")
    assert_equal :local, fo.mode
    assert_equal 1, db.backends(app)
    pid = fork do
      # The test's own connection is the test's business (as Active
      # Record's discard! is Rails'): out of the way, so that only the
      # listener's copy could end a session here.
      db.instance_variable_get(:@conn).socket_io.reopen(IO::NULL)
      GC.start # the parent's PG::Connection copy would be finished here...
      exit(0)  # ...or at exit, as Puma's workers do
    end
    Process.wait(pid)
    db.notify("forkwake", "after the child")
    col.wait("the parent's wake after the child exited") { |s| s.payloads("forkwake") == ["after the child"] }
    assert_equal 1, db.backends(app), "the child's exit ended the parent's session"
  end

  # At the fork, before any call in the child, the hub client's socket
  # inherited from the parent is closed in the child (and only there).
  def test_inherited_hub_socket_is_closed_at_fork
    h = hub
    fo = Listenhub::Failover.new(h.socket, database_url: DATABASE_URL)
    cleanup { fo.close }
    fo.subscribe("forkhub")
    assert_equal :hub, fo.mode
    out = LHTest.in_child do
      sock = fo.instance_variable_get(:@hub).instance_variable_get(:@sock)
      sock.closed? ? "closed" : "open"
    end
    assert_equal "closed", out
    db.notify("forkhub", "x")
    assert_equal :hub, fo.mode
    assert_nil fo.err
  end
end
