# frozen_string_literal: true

# Puma in cluster mode as a Rails app in production runs it.
workers 4
threads 2, 4
preload_app!
bind "unix://#{ENV.fetch('PUMA_SOCKET')}"
pidfile ENV.fetch("PUMA_PIDFILE")
worker_timeout 30
worker_shutdown_timeout 2
quiet
