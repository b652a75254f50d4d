# frozen_string_literal: true

module Listenhub
  # Released with the hub: the same version as `listenhub version`.
  VERSION = "0.1.0"
end
