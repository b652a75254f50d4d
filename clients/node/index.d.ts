// Type declarations of listenhub, the Node.js client of a listenhub hub.
// They describe index.js (CommonJS) and index.mjs (ESM, the same names);
// the README's API table is the prose version.

import { EventEmitter } from 'node:events';

/** A NOTIFY that reached this process. */
export interface Wake {
  type: 'wake';
  /** The subscription name (the hub's channel without prefix and suffix). */
  name: string;
  /** null for a durable wake (a NOTIFY without payload: "re-read"). */
  payload: string | null;
  /**
   * true for a NOTIFY without payload: may be coalesced with others, and is
   * synthesized after a gap (reconnect, failover, fail-back).
   */
  durable: boolean;
}

/** The hub's (or the local listener's) Postgres connection is (not) healthy. */
export interface Status {
  type: 'status';
  healthy: boolean;
}

export type Event = Wake | Status;

export interface SubscribeOptions {
  /** Bounds this caller's wait only; the subscription is abandoned. */
  signal?: AbortSignal;
}

export interface ClientOptions {
  /** Called synchronously for every wake, in wire order. */
  onWake?: (wake: Wake) => void;
  /** Called synchronously on every status. */
  onStatus?: (healthy: boolean) => void;
  /** ms to wait for an ack (2000). */
  ackTimeout?: number;
  /** ms a write may stay pending before the hub counts as gone (2000). */
  writeTimeout?: number;
  /** ms to wait for the connect (2000). */
  connectTimeout?: number;
  /** ms a frame from the hub may take from its first byte to its last (10000). */
  frameTimeout?: number;
  /**
   * ms without a single frame from the hub before it counts as frozen
   * (15000): it re-sends its status every 5 status intervals (5 s by
   * default). Raise it above 5 times the hub's --status-interval.
   */
  silenceTimeout?: number;
  /**
   * Check the socket's identity (true): its directory (owner, mode), the
   * socket file (lstat: a socket, its owner), the same file after connect.
   */
  peerCheck?: boolean;
  /** Further uids whose hub is accepted. */
  allowedUids?: number[];
  /** Events queued for events()/get() before the listener dies (65536). */
  maxPending?: number;
}

export interface LocalOptions {
  /** Default: LISTENHUB_DATABASE_URL, DATABASE_URL, then pg's PG* variables. */
  databaseUrl?: string;
  /** A pg client config (host, user, password, ...); wins over databaseUrl. */
  connectionConfig?: { connectionString?: string; [key: string]: unknown };
  /** The hub's --channel-prefix. */
  channelPrefix?: string;
  /** The hub's --channel-suffix. */
  channelSuffix?: string;
  /** application_name of the local connection ("listenhub-local"). */
  applicationName?: string;
  /** ms for the local connection's commands (10000). */
  localTimeout?: number;
  onWake?: (wake: Wake) => void;
  onStatus?: (healthy: boolean) => void;
  maxPending?: number;
}

export interface FailoverOptions extends ClientOptions, LocalOptions {
  /** pgbus's rule: once local, local until close() (false). */
  oneWay?: boolean;
  /** ms on the local listener before the hub is tried again (5000). */
  minLocal?: number;
  /** ms between fail-back attempts, doubling (1000). */
  probeInterval?: number;
  /** upper bound of that wait, ms (30000). */
  probeMaxInterval?: number;
  /** Called after the swap to the local listener, with the hub's error. */
  onFailover?: (reason: Error) => void;
  /** Called after the swap back to the hub. */
  onFailback?: () => void;
}

/**
 * What every listener offers: an EventEmitter in node-postgres's style, and
 * an async iterable. Every 'wake' and 'status' is emitted to its listeners
 * and queued for events() / get() / for await, unless a 'wake' or 'status'
 * listener (onWake, onStatus) came before the first events() or get():
 * then the iterator sees the events from that first call on. Neither takes
 * from the other. 'error' is emitted once at death (not for close(), and
 * only to a registered listener: with none, a death is done's value and
 * never an unhandled 'error'); 'end' follows death or close().
 */
export interface Listener extends EventEmitter, AsyncIterable<Event> {
  on(event: 'wake', listener: (wake: Wake) => void): this;
  on(event: 'status', listener: (healthy: boolean) => void): this;
  on(event: 'error', listener: (err: Error) => void): this;
  on(event: 'end', listener: (err: Error) => void): this;
  once(event: 'wake', listener: (wake: Wake) => void): this;
  once(event: 'status', listener: (healthy: boolean) => void): this;
  once(event: 'error', listener: (err: Error) => void): this;
  once(event: 'end', listener: (err: Error) => void): this;
  /** Resolves once LISTEN is active (hub ack, or local LISTEN). */
  subscribe(q: string, opts?: SubscribeOptions): Promise<void>;
  /** Fire-and-forget; never blocks. */
  unsubscribe(q: string): void;
  /** Alive and Postgres connected, as far as it knows. */
  healthy(): boolean;
  subscriptions(): Set<string>;
  /** Every event from the start (or from this first call, in callback mode). */
  events(): AsyncIterableIterator<Event>;
  [Symbol.asyncIterator](): AsyncIterableIterator<Event>;
  /** The next queued event; null after timeoutMs or once dead and drained. */
  get(timeoutMs?: number): Promise<Event | null>;
  /** Resolves once closed (socket or connection ended). Idempotent; safe from a handler. */
  close(): Promise<void>;
  /** Resolves with the error that ended the listener. */
  wait(): Promise<Error>;
  /** Why it died (null while alive). */
  readonly err: Error | null;
  /** Resolves with err once the listener is dead. */
  readonly done: Promise<Error>;
}

// Client has every member of Listener, declared there once (declaration
// merging).
export interface Client extends Listener {}

/** A connection to a hub. Dead after its first failure; never reconnects. */
export class Client implements Listener {
  private constructor();
  readonly path: string;
  readonly ackTimeout: number;
  readonly writeTimeout: number;
}

// Local has every member of Listener, declared there once (declaration
// merging).
export interface Local extends Listener {}

/** This process's own LISTEN connection (the pg package). */
export class Local implements Listener {
  private constructor();
  static create(opts?: LocalOptions): Promise<Local>;
  /** prefix + q + suffix. */
  channel(q: string): string;
  /** The pid of the current Postgres backend. */
  backendPid(): number | undefined;
  /** A round trip after every LISTEN/UNLISTEN queued before it. */
  sync(): Promise<void>;
}

export type Mode = 'hub' | 'local';
export const HUB: 'hub';
export const LOCAL: 'local';

// Failover has every member of Listener, declared there once (declaration
// merging).
export interface Failover extends Listener {}

/** The hub while it works, this process's own LISTEN while it does not. */
export class Failover implements Listener {
  private constructor();
  on(event: 'failover', listener: (reason: Error) => void): this;
  on(event: 'failback', listener: () => void): this;
  on(event: 'wake', listener: (wake: Wake) => void): this;
  on(event: 'status', listener: (healthy: boolean) => void): this;
  on(event: 'error', listener: (err: Error) => void): this;
  on(event: 'end', listener: (err: Error) => void): this;
  static create(socketPath: string, opts?: FailoverOptions): Promise<Failover>;
  readonly socketPath: string;
  /** Where wakes come from now. */
  mode(): Mode;
  /** The hub's error that caused the last failover (null on the hub). */
  readonly reason: Error | null;
}

/** Connects to the hub at path. Rejects with ConnError. */
export function connect(path: string, opts?: ClientOptions): Promise<Client>;

export const DEFAULT_ACK_TIMEOUT: number;
export const DEFAULT_WRITE_TIMEOUT: number;
export const DEFAULT_FRAME_TIMEOUT: number;
export const DEFAULT_SILENCE_TIMEOUT: number;

/** Everything the client throws. */
export class ListenhubError extends Error {
  constructor(message: string);
}
/** Closed by its owner. */
export class ClosedError extends ListenhubError {
  constructor();
}
/** The name is refused (too long once mapped, a NUL, the hub's nack); the client stays alive. */
export class InvalidNameError extends ListenhubError {
  constructor(subscriptionName: string, reason: string);
  readonly subscriptionName: string;
  readonly reason: string;
}
/** Refused at one of the hub's caps; the client stays alive. Not an InvalidNameError. */
export class LimitError extends ListenhubError {
  constructor(subscriptionName: string, reason: string);
  readonly subscriptionName: string;
  readonly reason: string;
}
/** Refused for another reason (LISTEN failed); the client is dead. */
export class NackError extends ListenhubError {
  constructor(subscriptionName: string, reason: string);
  readonly subscriptionName: string;
  readonly reason: string;
}
/** No ack within the ack timeout; the client is dead. */
export class AckTimeoutError extends ListenhubError {
  constructor(subscriptionName: string, timeoutMs: number);
  readonly subscriptionName: string;
  readonly timeout: number;
}
/** A transport failure: op is "dial", "peer", "read" or "write". */
export class ConnError extends ListenhubError {
  constructor(op: string, path: string, cause: unknown);
  readonly op: string;
  readonly path: string;
  readonly cause: unknown;
}
/** The hub refused this connection and said why; the client is dead. */
export class RefusedError extends ListenhubError {
  constructor(path: string, reason: string);
  readonly path: string;
  readonly reason: string;
}
/** events() was not drained: more than maxPending events waited. */
export class SlowConsumerError extends ListenhubError {}
/**
 * The hub does not deliver the notifications of the database the failover
 * listener was given (checked at start); it listens locally instead.
 */
export class OtherDatabaseError extends ListenhubError {
  constructor(path: string, database: string, timeoutMs: number);
  readonly path: string;
  readonly database: string;
}
/** The local listener failed too, after the hub failed. */
export class FailoverError extends ListenhubError {
  constructor(hub: unknown, local: unknown);
  readonly hub: unknown;
  readonly local: unknown;
}
