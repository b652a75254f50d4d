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
    # Nothing here may raise out of the fork: a listener that fails to
    # let go is logged, and the others still are.
    def release_inherited_listeners
      @live.keys.each do |l|
        # A weak map's keys can include an object being collected.
        next unless l.is_a?(Listener)

        l.send(:forked_child_close)
      rescue StandardError => e
        logger.error("listenhub: letting go of an inherited listener at fork raised: #{e.class}: #{e.message}")
      end
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

  # The wakes of a listener made without on_wake, waiting for
  # wait_for_wake or each: bounded, and finished at the listener's death.
  class WakeQueue
    def initialize(max)
      @max = max
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @q = []
      @finished = false
    end

    # Queues w; false when max wakes are waiting already.
    def push(w)
      @mu.synchronize do
        return true if @finished
        return false if @q.size >= @max

        @q << w
        @cv.signal
        true
      end
    end

    # No more wakes: pop returns what is left, then nil.
    def finish
      @mu.synchronize do
        @finished = true
        @cv.broadcast
      end
    end

    # The next wake, waiting up to timeout seconds (nil: for ever); nil on
    # timeout, or once finished and empty.
    def pop(timeout)
      deadline = timeout && Listenhub.monotonic + timeout
      @mu.synchronize do
        while @q.empty? && !@finished
          left = deadline && deadline - Listenhub.monotonic
          return nil if left && left <= 0

          @cv.wait(@mu, left)
        end
        @q.shift
      end
    end
  end
  private_constant :WakeQueue

  # How many wakes a listener made without on_wake holds for
  # wait_for_wake and each.
  DEFAULT_MAX_PENDING = 65_536

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

    # For a listener made without on_wake, in the style of the pg gem's
    # wait_for_notify: waits up to timeout seconds (nil: for ever) for the
    # next wake and returns it (with a block, yields it and returns the
    # block's value); nil on timeout, or once the listener is dead and
    # every wake taken. Raises ArgumentError for a listener with on_wake.
    def wait_for_wake(timeout = nil)
      raise ArgumentError, "listenhub: this listener hands its wakes to on_wake" unless @wakes

      w = @wakes.pop(timeout)
      return w unless w && block_given?

      yield w
    end

    # Yields every wake until the listener is dead (close, or a failure:
    # then err says which); an Enumerator without a block. For a listener
    # made without on_wake.
    def each
      return enum_for(:each) unless block_given?

      while (w = wait_for_wake)
        yield w
      end
      self
    end

    private

    # The on_wake to use: the given one, or, without one, a queue for
    # wait_for_wake and each (a full queue kills the listener with
    # SlowConsumerError, from a thread of its own: the caller may hold the
    # listener's locks).
    def wake_handler(on_wake)
      return on_wake if on_wake

      @wakes = WakeQueue.new(DEFAULT_MAX_PENDING)
      lambda do |w|
        Thread.new { die(SlowConsumerError.new(DEFAULT_MAX_PENDING)) } unless @wakes.push(w)
      end
    end

    # At death: wait_for_wake and each end once the queue is drained.
    def finish_wakes
      @wakes&.finish
    end

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
