'use strict';

// listenhub/pg-listen: pg-listen's createPostgresSubscriber, through the hub
// (lib/pglisten.js). Required as pg-listen is:
//
//   const createSubscriber = require('listenhub/pg-listen');
//   import createSubscriber from 'listenhub/pg-listen';

const { createPostgresSubscriber } = require('./lib/pglisten');

module.exports = Object.assign(createPostgresSubscriber, { default: createPostgresSubscriber, createPostgresSubscriber });
