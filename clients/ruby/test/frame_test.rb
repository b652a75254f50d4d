# frozen_string_literal: true

# The wire codec alone (docs/protocol.md): no hub, no database.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "minitest/autorun"
require "listenhub"

class FrameTest < Minitest::Test
  F = Listenhub::Frame

  def test_encode_is_compact_utf8_with_a_big_endian_length
    f = F.sub("é\"q")
    body = "{\"t\":\"sub\",\"q\":\"é\\\"q\"}".b
    assert_equal [body.bytesize].pack("N") + body, f
  end

  def test_decoder_takes_frames_split_anywhere_and_many_at_once
    frames = [F.encode({ "t" => "wake", "q" => "a", "p" => "x" }), F.encode({ "t" => "status", "healthy" => true }),
              F.encode({ "t" => "ack", "q" => "日本" })]
    all = frames.join
    (1..all.bytesize).each do |cut|
      d = F::Decoder.new
      got = []
      [all.byteslice(0, cut), all.byteslice(cut..)].each do |part|
        d.feed(part)
        while (m = d.next_message)
          got << m
        end
      end
      assert_equal %w[wake status ack], got.map { |m| m["t"] }, "cut at #{cut}"
      assert_nil d.partial_since
    end
  end

  def test_bad_frames_are_errors
    [[0].pack("N"), [(4 << 20) + 1].pack("N"), [2].pack("N") + "[]", [1].pack("N") + "{", [2].pack("N") + "\xff\xfe".b,
     [7].pack("N") + '{"t":1}'].each do |bad|
      d = F::Decoder.new
      d.feed(bad)
      assert_raises(F::FrameError, bad.inspect) { d.next_message }
    end
  end

  # A 4 MiB frame (the limit) in 128-byte reads: reassembly stays linear.
  def test_4mib_frame_in_128_byte_reads
    f = F.encode({ "t" => "wake", "q" => "a", "p" => "x" * ((4 << 20) - 40) })
    assert_operator f.bytesize - 4, :<=, F::MAX_LEN
    d = F::Decoder.new
    t0 = Listenhub.monotonic
    m = nil
    (0...f.bytesize).step(128) do |i|
      d.feed(f.byteslice(i, 128))
      m ||= d.next_message
    end
    assert_equal (4 << 20) - 40, m["p"].bytesize
    assert_operator Listenhub.monotonic - t0, :<, 10, "quadratic reassembly"
  end

  def test_name_rules
    assert_nil F.name_problem("a" * 63)
    assert_match(/64 bytes/, F.name_problem("a" * 64))
    assert_match(/NUL/, F.name_problem("a\0"))
    assert_match(/UTF-8/, F.name_problem("\xff".b))
    assert_equal '"a""b"', F.quote_ident('a"b')
    assert F.invalid_name_reason?("invalid channel: 64 bytes")
    assert F.limit_reason?("too many subscriptions")
    refute F.invalid_name_reason?("LISTEN failed: no connection")
  end
end
