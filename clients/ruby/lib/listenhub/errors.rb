# frozen_string_literal: true

module Listenhub
  # Base class of everything the gem raises.
  class Error < StandardError; end

  # A subclass of superclass whose initialize takes one argument per field,
  # keeps each behind a reader of that name and builds the message from them
  # with the block.
  def self.error_class(superclass, *fields, &message)
    Class.new(superclass) do
      attr_reader(*fields)

      define_method(:initialize) do |*args|
        unless args.size == fields.size
          raise ArgumentError, "wrong number of arguments (given #{args.size}, expected #{fields.size})"
        end

        fields.zip(args) { |f, v| instance_variable_set(:"@#{f}", v) }
        super(message.call(*args))
      end
    end
  end
  private_class_method :error_class

  # The hub does not deliver the notifications of the database the
  # Failover was given: it serves another database or cluster. The
  # Failover's reason when it listens on its own connection for it.
  OtherDatabaseError = error_class(Error, :socket_path, :database, :timeout) do |path, database, timeout|
    "listenhub: the hub at #{path} does not deliver the notifications of #{database} (a NOTIFY committed there " \
      "did not come back through it within #{timeout}s): it serves another database or cluster; listening on a " \
      "connection of this process (run the hub with this database's URL)"
  end

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
  InvalidNameError = error_class(Error, :name, :reason) do |name, reason|
    "listenhub: invalid subscription name #{name.inspect}: #{reason}"
  end

  # The hub refused the subscription at one of its caps ("too many
  # subscriptions", "too many channels"): final for that subscribe, the
  # connection stays (a Failover does not fail over: its own connection would
  # only move the load onto a backend of its own). Not an InvalidNameError:
  # the name is fine, and the same subscribe may pass once the hub has room.
  LimitError = error_class(Error, :name, :reason) do |name, reason|
    "listenhub: hub limit reached for #{name.inspect}: #{reason}"
  end

  # The hub refused a subscription for a reason other than the name (its
  # LISTEN failed): the client is dead after it.
  NackError = error_class(Error, :name, :reason) { |name, reason| "listenhub: hub refused #{name.inspect}: #{reason}" }

  # No ack or nack within the ack timeout: the hub is wedged. The client is
  # dead after it.
  AckTimeoutError = error_class(Error, :name, :timeout) { |name, timeout| "listenhub: no ack for #{name.inspect} within #{timeout}s" }

  # A transport failure of the hub connection: the connect (no socket, stale
  # socket, wrong peer: op "dial" or "peer"), a read (EOF, which is also what
  # an eviction by the hub looks like; a malformed frame) or a write
  # (including one that stalled past the write timeout). The cause is kept
  # as cause_detail.
  ConnError = error_class(Error, :op, :path, :cause_detail) { |op, path, cause| "listenhub: #{op} #{path}: #{cause}" }

  # The hub refused this connection at accept and said why (its first frame
  # was a nack): the client is dead, and a Failover fails over.
  RefusedError = error_class(Error, :path, :reason) do |path, reason|
    "listenhub: the hub at #{path} refused this connection: #{reason}"
  end

  # The object was made in another process, before fork(): the child must
  # make its own. Raised at once by every call in the child; the parent's
  # object is not affected (its socket is never shut down or written from
  # the child).
  ForkedError = error_class(ClosedError, :parent_pid) do |parent_pid|
    "listenhub: this listener was created in process #{parent_pid} before fork(); " \
      "create it in the child (after fork), e.g. in Puma's on_worker_boot or lazily on first use " \
      "(the Action Cable adapter does that itself)"
  end

  # The local listener failed too, after the hub failed: the Failover is
  # dead.
  FailoverError = error_class(Error, :hub, :local) do |hub, local|
    "listenhub: local listener failed (#{local}) after hub failure (#{hub})"
  end

  # A listener made without on_wake held more than max wakes that
  # wait_for_wake or each did not take: it is dead, as a worker that stops
  # reading is evicted by the hub.
  SlowConsumerError = error_class(Error, :max) do |max|
    "listenhub: more than #{max} wakes not taken by wait_for_wake or each"
  end

  # A subscribe's own wait (its timeout: argument) ran out; the listener is
  # fine and the subscription is abandoned.
  class TimeoutError < Error; end
end
