'use strict';

// listenhub/graphile-worker: hubPool(pool), a pg Pool for graphile-worker's
// pgPool option whose LISTEN goes through the hub (lib/graphile.js).

const { hubPool } = require('./lib/graphile');

module.exports = { hubPool };
