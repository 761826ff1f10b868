// A client of the omniserve Realtime API (current dialect), written to be read.
//
//   const rt = new RealtimeClient({ mode: "audio", apiKey, initPayload: { system_prompt: "..." } });
//   rt.addEventListener("server", (e) => console.log(e.detail));   // every server event
//   rt.addEventListener("state", (e) => console.log(e.detail));    // lifecycle changes
//   rt.connect();
//   rt.appendAudio(float32Pcm16k);                                // once per second
//   rt.close();
//
// Lifecycle (docs/PROTOCOL.md): connect -> session.queued / session.queue_update (optional) ->
// session.queue_done -> we send session.init -> session.created -> input.append ... ->
// session.close -> session.closed. The client must not send session.init before queue_done.
//
// Resume: when session.created carries a resume_token, every later server event carries a `seq`.
// If the socket drops without session.closed, the client reopens /v1/realtime?mode=<same> and
// sends session.resume {session_id, resume_token, last_seq} as its first event. The server answers
// session.resumed (with a new token) and replays every event after last_seq, or
// session.resync_required, or an error session_not_found / resume_expired. Without a token (the
// server does not offer resume) a dropped connection simply ends the session.

import { float32ToBase64 } from "./pcm.js";
// protocol.js is the server's own list of the protocol's names (api/protocol/catalog.py)
import { CLOSING_ERRORS, ClientEvent, CloseReason, RESUME_ERRORS, ServerEvent } from "./protocol.js";

/** States, in the order a session normally goes through them. */
export const STATES = [
  "idle", // not connected yet
  "connecting", // WebSocket opening
  "queued", // waiting for a worker slot (position known)
  "initializing", // session.init sent, waiting for session.created
  "active", // session running
  "reconnecting", // connection lost, trying to resume
  "recovering", // the server moves the session to another worker
  "closed", // over (see closeReason / closeCode)
];

const RESUME_DELAYS_MS = [250, 500, 1000, 2000, 4000, 8000, 8000, 8000];

export class RealtimeClient extends EventTarget {
  /**
   * @param {object} opts
   * @param {"chat"|"audio"|"video"} opts.mode
   * @param {string} [opts.apiKey] sent as ?api_key= (browsers cannot set WebSocket headers)
   * @param {object} [opts.initPayload] the session.init payload
   * @param {string} [opts.url] base ws(s)://host; defaults to the page's own origin
   */
  constructor({ mode, apiKey = "", initPayload = {}, url = "" }) {
    super();
    this.mode = mode;
    this.apiKey = apiKey;
    this.initPayload = initPayload;
    this.baseUrl = url || `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}`;
    this.state = "idle";
    this.ws = null;
    this.sessionId = null;
    this.resumeToken = null;
    this.lastSeq = 0;
    this.initSent = false;
    this.closeReason = null; // session.closed reason, or why the socket closed without one
    this.closingError = null; // the error code that came just before the server closed
    this.closeCode = null; // WebSocket close code
    this.userClosing = false;
    this.resumeAttempt = 0;
    this.connectedAt = null; // the duration limit counts from the first connect
  }

  /** Open the connection (the server then queues us or admits us at once). */
  connect() {
    this.connectedAt ??= performance.now();
    this._open(false);
  }

  _url() {
    const q = new URLSearchParams({ mode: this.mode });
    if (this.apiKey) q.set("api_key", this.apiKey);
    return `${this.baseUrl}/v1/realtime?${q}`;
  }

  _open(resuming) {
    this._setState(resuming ? "reconnecting" : "connecting");
    // The public SDK offers the map.realtime subprotocol; omniserve selects it.
    const ws = new WebSocket(this._url(), ["map.realtime"]);
    this.ws = ws;
    ws.onopen = () => {
      if (resuming) {
        this._sendNow({
          type: ClientEvent.SESSION_RESUME,
          session_id: this.sessionId,
          resume_token: this.resumeToken,
          last_seq: this.lastSeq,
        });
      }
    };
    ws.onmessage = (msg) => this._onMessage(msg.data);
    ws.onclose = (ev) => {
      if (ws === this.ws) this._onSocketClosed(ev);
    };
  }

  _onMessage(data) {
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      return; // the server sends JSON text frames only
    }
    if (typeof ev.seq === "number") {
      if (ev.seq <= this.lastSeq) return; // a replayed event we already have
      this.lastSeq = ev.seq;
    }
    switch (ev.type) {
      case ServerEvent.SESSION_QUEUED:
      case ServerEvent.SESSION_QUEUE_UPDATE:
        if (!this.initSent) this._setState("queued");
        break;
      case ServerEvent.SESSION_QUEUE_DONE:
        // Chat mode may also send queue events before a later turn: init only once.
        if (!this.initSent) {
          this.initSent = true;
          this._sendNow({ type: ClientEvent.SESSION_INIT, payload: this.initPayload });
          this._setState("initializing");
        }
        break;
      case ServerEvent.SESSION_CREATED:
        this.sessionId = ev.session_id;
        this.resumeToken = ev.resume_token || null;
        this._setState("active");
        break;
      case ServerEvent.SESSION_RESUMED:
        this.resumeToken = ev.resume_token || this.resumeToken;
        this.resumeAttempt = 0;
        this._setState("active");
        break;
      case ServerEvent.SESSION_RECOVERING:
        this._setState("recovering");
        break;
      case ServerEvent.SESSION_RECOVERED:
        this._setState("active");
        break;
      case ServerEvent.SESSION_CLOSED:
        this.closeReason = ev.reason || "closed";
        this._setState("closed");
        break;
      case ServerEvent.ERROR:
        // the errors after which the server closes the socket (docs/PROTOCOL.md, "Error codes")
        if (CLOSING_ERRORS.includes(ev.error?.code)) this.closingError = ev.error.code;
        if (this.state === "reconnecting" && RESUME_ERRORS.includes(ev.error?.code)) {
          this.resumeToken = null; // the session is gone: stop trying
          this.closeReason = "resume_failed";
        }
        break;
      default:
        break;
    }
    this.dispatchEvent(new CustomEvent("server", { detail: ev }));
  }

  _onSocketClosed(ev) {
    if (this.state === "closed") {
      this.closeCode ??= ev.code;
      this.dispatchEvent(new CustomEvent("socketclosed", { detail: { code: ev.code } }));
      return;
    }
    const canResume =
      !this.userClosing &&
      this.resumeToken &&
      this.sessionId &&
      this.resumeAttempt < RESUME_DELAYS_MS.length;
    if (canResume) {
      const delay = RESUME_DELAYS_MS[this.resumeAttempt++];
      this._setState("reconnecting");
      setTimeout(() => {
        if (!this.userClosing && this.state === "reconnecting") this._open(true);
      }, delay);
      return;
    }
    this.closeCode = ev.code;
    this.closeReason ??= this.userClosing
      ? CloseReason.USER_STOP
      : this.closingError || (ev.code === 1006 ? "connection_lost" : "server_closed");
    this._setState("closed");
    this.dispatchEvent(new CustomEvent("socketclosed", { detail: { code: ev.code } }));
  }

  _setState(state) {
    if (state === this.state) return;
    const previous = this.state;
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: { state, previous } }));
  }

  _sendNow(event) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(event));
      return true;
    }
    return false;
  }

  /** Whether input may be sent now (the spec: only after session.created). */
  get ready() {
    return this.state === "active" && this.ws?.readyState === WebSocket.OPEN;
  }

  /**
   * Duplex input: 16 kHz mono float32 PCM (about 1 s), optional JPEG frames (base64, no prefix).
   * Returns false when it was not sent (not active, or reconnecting: input is not buffered).
   */
  appendAudio(pcm16k, { frames = [], forceListen = false } = {}) {
    if (!this.ready) return false;
    const input = { audio: float32ToBase64(pcm16k) };
    if (frames.length) input.video_frames = frames;
    if (forceListen) input.force_listen = true;
    return this._sendNow({ type: ClientEvent.INPUT_APPEND, input });
  }

  /** Chat mode: one turn (messages plus streaming, generation, tts options). */
  sendTurn(input) {
    if (!this.ready) return false;
    return this._sendNow({ type: ClientEvent.INPUT_APPEND, input });
  }

  /** End the session; the server answers session.closed. */
  close(reason = CloseReason.USER_STOP) {
    this.userClosing = true;
    if (!this._sendNow({ type: ClientEvent.SESSION_CLOSE, reason })) {
      this.ws?.close();
      if (this.state !== "closed") {
        this.closeReason ??= reason;
        this._setState("closed");
      }
    }
  }

  /** Drop the socket without a session.close (for testing resume). */
  dropConnection() {
    this.ws?.close(4000, "dropped by the client");
  }
}
