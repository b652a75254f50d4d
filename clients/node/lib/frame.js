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
//
// Linear in the bytes fed: chunks are kept in a list and joined once, when
// the frame they hold is complete (joining on every feed made a 4 MiB frame
// in 128-byte reads cost seconds of CPU). partialSince is the Date.now() at
// which the incomplete frame now buffered began (null when nothing is
// buffered), for the client's frame timeout.
class Decoder {
  constructor() {
    this.chunks = [];
    this.len = 0;
    this.partialSince = null;
  }

  feed(chunk) {
    if (!chunk.length) return;
    if (this.len === 0) this.partialSince = Date.now();
    this.chunks.push(chunk);
    this.len += chunk.length;
  }

  buffered() {
    return this.len;
  }

  // The first n buffered bytes as one Buffer (n <= len): the chunks they
  // span are joined into one, once.
  _head(n) {
    if (this.chunks[0].length < n) {
      let k = 0;
      for (let got = 0; got < n; k++) got += this.chunks[k].length;
      const joined = Buffer.concat(this.chunks.slice(0, k));
      this.chunks.splice(0, k, joined);
    }
    return this.chunks[0];
  }

  // Drops the first n buffered bytes.
  _skip(n) {
    this.len -= n;
    while (n > 0) {
      const c = this.chunks[0];
      if (c.length <= n) {
        n -= c.length;
        this.chunks.shift();
      } else {
        this.chunks[0] = c.subarray(n);
        n = 0;
      }
    }
    this.partialSince = this.len ? Date.now() : null;
  }

  // The next whole message (an object with a string t), or null when more
  // bytes are needed. Throws FrameError on a malformed frame.
  next() {
    if (this.len < 4) return null;
    const n = this._head(4).readUInt32BE(0);
    if (n === 0 || n > MAX_LEN) throw new FrameError(`bad frame length ${n}`);
    if (this.len < 4 + n) return null;
    const body = this._head(4 + n).subarray(4, 4 + n);
    this._skip(4 + n);
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

// q's bytes as a hub reports a name that is not valid UTF-8 ("q64" in its
// nack): UTF-8, a lone surrogate as its 3-byte form (WTF-8), where
// Buffer.from would put U+FFFD.
function wireBytes(q) {
  if (isWellFormed(q)) return Buffer.from(q, 'utf8');
  const out = [];
  for (let i = 0; i < q.length; i++) {
    const c = q.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < q.length) {
      const d = q.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        out.push(Buffer.from(q.slice(i, i + 2), 'utf8'));
        i++;
        continue;
      }
    }
    if (c >= 0xd800 && c <= 0xdfff) {
      out.push(Buffer.from([0xe0 | (c >> 12), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f)]));
    } else {
      out.push(Buffer.from(String.fromCharCode(c), 'utf8'));
    }
  }
  return Buffer.concat(out);
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
  wireBytes,
  invalidNameReason,
  limitReason,
  quoteIdent,
};
