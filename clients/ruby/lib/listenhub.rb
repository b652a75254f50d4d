# frozen_string_literal: true

# listenhub: the Ruby client of a listenhub hub (one shared Postgres LISTEN
# connection per host, wakes fanned out to the worker processes over a Unix
# socket).
#
# - Listenhub.connect / Listenhub::Client: the hub client (the standard
#   library only).
# - Listenhub::Failover: the hub while it works, this process's own LISTEN
#   connection (the pg gem) while it does not, and the hub again once it is
#   back.
# - action_cable/subscription_adapter/listenhub: `adapter: listenhub` in
#   config/cable.yml.
#
# Wire protocol: docs/protocol.md in the listenhub repository.
require_relative "listenhub/version"
require_relative "listenhub/errors"
require_relative "listenhub/listener"
require_relative "listenhub/frame"
require_relative "listenhub/client"
require_relative "listenhub/local"
require_relative "listenhub/failover"
