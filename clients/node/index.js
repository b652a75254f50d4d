'use strict';

// listenhub: the Node.js client of a listenhub hub (one shared Postgres
// LISTEN connection per host, wakes fanned out over a Unix socket).
//
//   connect(path, opts)          the hub client (node:net only)
//   Failover.create(path, opts)  the hub while it works, this process's own
//                                LISTEN connection (pg) after its first failure
//
// Wire protocol: docs/protocol.md in the listenhub repository. The exports
// live in lib/api.js, which index.mjs loads too.

module.exports = require('./lib/api');
