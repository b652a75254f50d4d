# frozen_string_literal: true

require_relative "errors"

module Listenhub
  # Every Client, Local and Failover alive in this process, held weakly,
  # so that a forked child can let go of them at the fork itself.
  @live = ObjectSpace::WeakMap.new

  class << self
    # Records a listener made in this process (Listener#track).
    def track_listener(listener)
      @live[listener] = true
    end

    # In a forked child, at once: every listener inherited from the parent
    # lets go of its copies of the parent's sockets (release_in_forked_child),
    # before the child can use them, and before its exit could finish the
    # parent's Postgres session with a Terminate.
    def release_inherited_listeners
      @live.keys.each { |l| l.send(:forked_child_close) }
    end
  end

  # Process._fork (Ruby 3.1 and later) is what every fork goes through:
  # Kernel#fork, Process.fork, IO.popen("-"), Puma's workers.
  module ForkHook
    def _fork
      pid = super
      Listenhub.release_inherited_listeners if pid.zero?
      pid
    end
  end
  Process.singleton_class.prepend(ForkHook) if Process.respond_to?(:_fork)

  # What Client, Local and Failover share. About fork(): an object made in
  # another process raises ForkedError at once in the child, and the child
  # lets go of its copies of the connections without touching the parent's.
  # The includer sets @pid when it is made and defines
  # release_in_forked_child.
  module Listener
    # Why the listener is dead (nil while it lives); ForkedError in a
    # forked child.
    def err
      @pid == Process.pid ? @err : ForkedError.new(@pid)
    end

    private

    # Called by the includer once @pid is set: the listener is let go of
    # at fork (Listenhub.release_inherited_listeners).
    def track_for_fork
      Listenhub.track_listener(self)
    end

    def check_fork!
      raise ForkedError.new(@pid) if @pid != Process.pid && forked_child_close
    end

    # Runs the block; what it raises is logged as "<what> raised", not
    # passed on: the application's callback must not kill the listener's
    # thread.
    def guarded(what)
      yield
    rescue StandardError => e
      Listenhub.logger.error("#{what} raised: #{e.class}: #{e.message}")
    end

    # In a forked child: release_in_forked_child runs once. True in the
    # child.
    def forked_child_close
      return false if @pid == Process.pid

      unless @forked
        @forked = true
        release_in_forked_child
      end
      true
    end
  end
end
