# frozen_string_literal: true

require_relative "errors"

module Listenhub
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
