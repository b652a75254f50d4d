# frozen_string_literal: true

# Runs every suite of the gem in one process (what go test ./clients/
# runs): ruby -Ilib -Itest/rails test/run.rb [minitest options, e.g. -n /pat/].
# test/rails comes first on the load path: Rails' copied tests require
# "test_helper" and mean its harness.
Dir[File.join(__dir__, "**", "*_test.rb")].sort.each { |f| require f }
