# frozen_string_literal: true

module Listenhub
  # Base class of everything the gem raises.
  class Error < StandardError; end

  # The client (or failover listener) was closed by its owner.
  class ClosedError < Error
    def initialize(msg = "listenhub: closed")
      super
    end
  end

  # The subscription name itself is refused: longer than 63 bytes once
  # mapped to a Postgres channel, a NUL, not UTF-8. Final for that name and
  # harmless for the transport: the client stays alive and a Failover does
  # not fail over because of it.
  class InvalidNameError < Error
    attr_reader :q, :reason

    def initialize(q, reason)
      @q = q
      @reason = reason
      super("listenhub: invalid subscription name #{q.inspect}: #{reason}")
    end
  end

  # The hub refused the subscription at one of its caps ("too many
  # subscriptions", "too many channels"): final for that subscribe, the
  # connection stays (a Failover does not fail over: its own connection would
  # only move the load onto a backend of its own).
  class LimitError < InvalidNameError; end

  # The hub refused a subscription for a reason other than the name (its
  # LISTEN failed): the client is dead after it.
  class NackError < Error
    attr_reader :q, :reason

    def initialize(q, reason)
      @q = q
      @reason = reason
      super("listenhub: hub refused #{q.inspect}: #{reason}")
    end
  end

  # No ack or nack within the ack timeout: the hub is wedged. The client is
  # dead after it.
  class AckTimeoutError < Error
    attr_reader :q, :timeout

    def initialize(q, timeout)
      @q = q
      @timeout = timeout
      super("listenhub: no ack for #{q.inspect} within #{timeout}s")
    end
  end

  # A transport failure of the hub connection: the connect (no socket, stale
  # socket, wrong peer: op "dial" or "peer"), a read (EOF, which is also what
  # an eviction by the hub looks like; a malformed frame) or a write
  # (including one that stalled past the write timeout).
  class ConnError < Error
    attr_reader :op, :path, :cause_detail

    def initialize(op, path, cause)
      @op = op
      @path = path
      @cause_detail = cause
      super("listenhub: #{op} #{path}: #{cause}")
    end
  end

  # The hub refused this connection at accept and said why (its first frame
  # was a nack): the client is dead, and a Failover fails over.
  class RefusedError < Error
    attr_reader :path, :reason

    def initialize(path, reason)
      @path = path
      @reason = reason
      super("listenhub: the hub at #{path} refused this connection: #{reason}")
    end
  end

  # The object was made in another process, before fork(): the child must
  # make its own. Raised at once by every call in the child; the parent's
  # object is not affected (its socket is never shut down or written from
  # the child).
  class ForkedError < ClosedError
    attr_reader :parent_pid

    def initialize(parent_pid)
      @parent_pid = parent_pid
      super("listenhub: this listener was created in process #{parent_pid} before fork(); " \
            "create it in the child (after fork), e.g. in Puma's on_worker_boot or lazily on first use " \
            "(the Action Cable adapter does that itself)")
    end
  end

  # The local listener failed too, after the hub failed: the Failover is
  # dead.
  class FailoverError < Error
    attr_reader :hub, :local

    def initialize(hub, local)
      @hub = hub
      @local = local
      super("listenhub: local listener failed (#{local}) after hub failure (#{hub})")
    end
  end

  # A subscribe's own wait (its timeout: argument) ran out; the listener is
  # fine and the subscription is abandoned.
  class TimeoutError < Error; end
end
