# frozen_string_literal: true

# The harness of Rails' subscription adapter tests (subscription_adapter/
# common.rb and channel_prefix.rb, copied verbatim from Rails 6.1): what
# their `require "test_helper"` expects from actioncable/test/test_helper.rb
# (Action Cable, ActiveSupport::TestCase, ActionCable::TestCase), plus the
# real hub and the real Postgres of the gem's own test helper.

$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__))
require_relative "../test_helper"
require "action_cable"
require "active_record"
require "active_support/test_case"
require "active_support/testing/method_call_assertions"
require "action_cable/subscription_adapter/listenhub"

ActionCable.server.config.cable = { "adapter" => "test" }
ActionCable.server.config.logger = Logger.new(nil)

class ActionCable::TestCase < ActiveSupport::TestCase # rubocop:disable Style/ClassAndModuleChildren
  include ActiveSupport::Testing::MethodCallAssertions
end

module LHRails
  module_function

  # LHTEST_DATABASE_URL as Active Record configuration (libpq parses it:
  # any URL or keyword string libpq takes).
  def ar_config(url = LHTest::DATABASE_URL)
    kv = PG::Connection.conninfo_parse(url).each_with_object({}) { |o, h| h[o[:keyword]] = o[:val] if o[:val] }
    { adapter: "postgresql", host: kv["host"], port: kv["port"], database: kv["dbname"], username: kv["user"],
      password: kv["password"], sslmode: kv["sslmode"] }.compact
  end

  def establish
    ActiveRecord::Base.establish_connection(ar_config)
    ActiveRecord::Base.connection
  end

  # One hub for the whole adapter suite (each test makes its own adapters).
  def hub
    @hub ||= begin
      h = LHTest::Hub.new("rails-adapter")
      Minitest.after_run { h.close }
      h
    end
  end
end
