'use strict';

// listenhub: the Node.js client of a listenhub hub (one shared Postgres
// LISTEN connection per host, wakes fanned out over a Unix socket).
//
//   connect(path, opts)          the hub client (node:net only)
//   Failover.create(path, opts)  the hub while it works, this process's own
//                                LISTEN connection (pg) after its first failure
//
// Wire protocol: docs/protocol.md in the listenhub repository.

const { Client, connect, DEFAULT_ACK_TIMEOUT, DEFAULT_WRITE_TIMEOUT, DEFAULT_FRAME_TIMEOUT } = require('./lib/client');
const { Failover, HUB, LOCAL } = require('./lib/failover');
const { Local } = require('./lib/local');
const errors = require('./lib/errors');

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
  ...errors,
};
