# frozen_string_literal: true

require_relative "lib/listenhub/version"

Gem::Specification.new do |s|
  s.name = "listenhub"
  s.version = Listenhub::VERSION
  s.summary = "One Postgres LISTEN connection per host: the Ruby client of a listenhub hub, and its Action Cable adapter"
  s.description = <<~DESC
    The Ruby client of a listenhub hub (one shared Postgres LISTEN connection
    per host, wakes fanned out to the worker processes over a Unix socket),
    with a failover to a LISTEN connection of its own while the hub is away,
    and an Action Cable subscription adapter (adapter: listenhub in
    config/cable.yml), a drop-in for adapter: postgresql.
  DESC
  s.license = "MIT"
  s.authors = ["The listenhub authors"]
  s.homepage = "https://github.com/listenhub/listenhub"
  s.metadata = { "source_code_uri" => "https://github.com/listenhub/listenhub/tree/main/clients/ruby",
                 "changelog_uri" => "https://github.com/listenhub/listenhub/blob/main/CHANGELOG.md" }
  s.required_ruby_version = ">= 3.1"
  s.files = Dir.chdir(__dir__) { Dir["lib/**/*.rb"] + %w[README.md LICENSE listenhub.gemspec] }
  s.require_paths = ["lib"]
  s.add_dependency "pg", ">= 1.1", "< 2"
end
