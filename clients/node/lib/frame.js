'use strict';

// The wire codec (docs/protocol.md): 4-byte big-endian length + one JSON
// object. No I/O here.

// Largest frame body either side may send (4 MiB): a longer length header is
// a protocol error, the reader closes the connection without allocating.
const MAX_LEN = 4 << 20;
// Postgres truncates identifiers at NAMEDATALEN-1 bytes.
const MAX_NAME_BYTES = 63;

class FrameError extends Error {}

function encode(msg) {
  const body = Buffer.from(JSON.stringify(msg), 'utf8');
  const out = Buffer.allocUnsafe(4 + body.length);
  out.writeUInt32BE(body.length, 0);
  body.copy(out, 4);
  return out;
}

const sub = (q) => encode({ t: 'sub', q });
const unsub = (q) => encode({ t: 'unsub', q });

// Incremental decoder: feed() what a read returned, then next() until it
// returns null. A stream has no message boundaries: a chunk may hold half a
// frame or twenty.
class Decoder {
  constructor() {
    this.buf = Buffer.alloc(0);
  }

  feed(chunk) {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
  }

  buffered() {
    return this.buf.length;
  }

  // The next whole message (an object with a string t), or null when more
  // bytes are needed. Throws FrameError on a malformed frame.
  next() {
    if (this.buf.length < 4) return null;
    const n = this.buf.readUInt32BE(0);
    if (n === 0 || n > MAX_LEN) throw new FrameError(`bad frame length ${n}`);
    if (this.buf.length < 4 + n) return null;
    const body = this.buf.subarray(4, 4 + n);
    this.buf = this.buf.subarray(4 + n);
    let msg;
    try {
      msg = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body));
    } catch (e) {
      throw new FrameError(`bad frame body: ${e.message}`);
    }
    if (msg === null || typeof msg !== 'object' || Array.isArray(msg) || typeof msg.t !== 'string') {
      throw new FrameError('frame is not an object with a string "t"');
    }
    return msg;
  }
}

// Why q can never be a subscription name whatever the hub's prefix and
// suffix (null if it may be): checked before any round trip.
function nameProblem(q) {
  if (typeof q !== 'string') return 'not a string';
  if (!isWellFormed(q)) return 'not valid UTF-8 (a lone surrogate)';
  const n = Buffer.byteLength(q, 'utf8');
  if (n > MAX_NAME_BYTES) return `${n} bytes, the limit is ${MAX_NAME_BYTES}`;
  if (q.includes('\u0000')) return 'contains NUL';
  return null;
}

// Why the mapped channel is refused (null if fine).
function channelProblem(channel) {
  if (channel === '') return 'invalid channel: empty';
  const n = Buffer.byteLength(channel, 'utf8');
  if (n > MAX_NAME_BYTES) return `invalid channel: ${n} bytes, the limit is ${MAX_NAME_BYTES}`;
  if (channel.includes('\u0000')) return 'invalid channel: contains NUL';
  return null;
}

function isWellFormed(s) {
  if (typeof s.isWellFormed === 'function') return s.isWellFormed();
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?:^|[^\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

// Tells a nack about the name (final for that name, the connection is fine)
// from any other nack (this hub cannot serve: fail over). Protocol v1 has no
// codes, so the reason words are the contract; same rule as the Go client.
function invalidNameReason(reason) {
  const r = String(reason || '').toLowerCase();
  return r.startsWith('invalid') || r.includes('invalid channel') || r.includes('too long') || r.includes('contains nul');
}

// Tells a refusal at one of the hub's caps ("too many subscriptions", "too
// many channels"): final for that subscribe, the connection stays.
function limitReason(reason) {
  return String(reason || '').toLowerCase().startsWith('too many ');
}

// A channel as a Postgres quoted identifier, every '"' doubled: no name can
// inject SQL, and case is kept.
function quoteIdent(channel) {
  return '"' + channel.replace(/"/g, '""') + '"';
}

module.exports = {
  MAX_LEN,
  MAX_NAME_BYTES,
  FrameError,
  Decoder,
  encode,
  sub,
  unsub,
  nameProblem,
  channelProblem,
  invalidNameReason,
  limitReason,
  quoteIdent,
};
