// The package's main exports, in one CommonJS module that both entry
// points load (index.js for require, index.mjs for import): one set of
// classes, so instanceof holds across them. It has no .mjs sibling, so no
// resolver that prefers .mjs (or maps ./x.js to ./x) can turn an entry's
// import of it back into the entry itself.
'use strict';

const { Client, connect, DEFAULT_ACK_TIMEOUT, DEFAULT_WRITE_TIMEOUT, DEFAULT_FRAME_TIMEOUT, DEFAULT_SILENCE_TIMEOUT } = require('./client');
const { Failover, HUB, LOCAL } = require('./failover');
const { Local } = require('./local');
const errors = require('./errors');

module.exports = {
  connect,
  Client,
  Failover,
  Local,
  HUB,
  LOCAL,
  DEFAULT_ACK_TIMEOUT,
  DEFAULT_WRITE_TIMEOUT,
  DEFAULT_FRAME_TIMEOUT,
  DEFAULT_SILENCE_TIMEOUT,
  ...errors,
};
