// ESM entry point of listenhub: the same objects as the CommonJS entry
// (index.js), re-exported by name so that
//
//   import { connect, Failover, ConnError } from 'listenhub';
//
// works. The CommonJS module is the one implementation: both entry points
// hand out the very same classes, so instanceof holds across them.
import cjs from './lib/api.js'; // not ./index.js: see lib/api.js

export const {
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
  ListenhubError,
  ClosedError,
  InvalidNameError,
  LimitError,
  NackError,
  AckTimeoutError,
  ConnError,
  RefusedError,
  SlowConsumerError,
  OtherDatabaseError,
  FailoverError,
} = cjs;

export default cjs;
