// The session status panel: state, place in the queue, time used against the limit, KV cache,
// backend, close reason, and errors as sentences.

import { clock, closeCodeText, closeReasonText, errorText } from "./messages.js";
import { ServerEvent } from "./protocol.js";

const STATE_LABELS = {
  idle: "Not connected",
  connecting: "Connecting…",
  queued: "Waiting in the queue",
  initializing: "Starting the session…",
  active: "Session active",
  reconnecting: "Connection lost, resuming…",
  recovering: "Moving to another worker…",
  closed: "Session ended",
};

export class StatusPanel {
  /**
   * @param {object} els elements by role: state, queue, queuePosition, queueWait, elapsed,
   *   timeBar, kvMeter, kvText, backend, closeReason, notice
   * @param {object} config /web/config (duration limits, context size)
   */
  constructor(els, config) {
    this.els = els;
    this.config = config;
    this.client = null;
    this.timer = null;
    this.reset("chat");
  }

  /** A fresh panel for ``mode``: the client it followed (closing, perhaps) no longer shows. */
  reset(mode) {
    this.client = null;
    clearInterval(this.timer);
    this.mode = mode;
    this.limitS = this.config.duration_limits_s?.[mode] ?? 0;
    this.setState("idle");
    this.hideQueue();
    this.setKv(null);
    this.els.backend.textContent = "—";
    this.els.closeReason.textContent = "—";
    this.els.closeReason.dataset.reason = "";
    this.els.elapsed.textContent = `0:00 / ${clock(this.limitS)}`;
    this.els.timeBar.value = 0;
    this.els.timeBar.max = this.limitS || 1;
    this.clearNotice();
  }

  /** Follow a RealtimeClient until it closes. */
  bind(client) {
    this.client = client;
    const mine = () => this.client === client;
    client.addEventListener("state", (e) => mine() && this.setState(e.detail.state));
    client.addEventListener("server", (e) => mine() && this.onServer(e.detail));
    client.addEventListener("socketclosed", (e) => mine() && this.onSocketClosed(e.detail.code));
    clearInterval(this.timer);
    this.timer = setInterval(() => this.tick(), 500);
  }

  tick() {
    const c = this.client;
    if (!c || c.connectedAt == null) return;
    const elapsed = (performance.now() - c.connectedAt) / 1000;
    this.els.elapsed.textContent = `${clock(elapsed)} / ${clock(this.limitS)}`;
    this.els.timeBar.value = Math.min(elapsed, this.limitS);
    if (c.state === "closed") clearInterval(this.timer);
  }

  setState(state) {
    this.els.state.textContent = STATE_LABELS[state] || state;
    this.els.state.dataset.state = state;
    if (state !== "queued") this.hideQueue();
  }

  onServer(ev) {
    switch (ev.type) {
      case ServerEvent.SESSION_QUEUED:
      case ServerEvent.SESSION_QUEUE_UPDATE:
        this.showQueue(ev.position, ev.estimated_wait_s, ev.queue_length);
        break;
      case ServerEvent.SESSION_QUEUE_DONE:
        this.hideQueue();
        break;
      case ServerEvent.SESSION_CREATED:
        if (ev.metrics?.backend) this.setBackend(ev.metrics.backend);
        if (typeof ev.prompt_length === "number" && ev.mode === "full_duplex") {
          this.setKv(ev.prompt_length);
        }
        break;
      case ServerEvent.SESSION_RESYNC_REQUIRED:
        this.notice("The connection dropped; some output was lost while it was down.", "warn");
        break;
      case ServerEvent.RESPONSE_OUTPUT_DELTA:
        if (typeof ev.metrics?.kv_cache_length === "number") this.setKv(ev.metrics.kv_cache_length);
        if (ev.metrics?.backend) this.setBackend(ev.metrics.backend);
        break;
      case ServerEvent.RESPONSE_DONE:
        if (ev.metrics?.backend) this.setBackend(ev.metrics.backend);
        break;
      case ServerEvent.SESSION_CLOSED:
        this.els.closeReason.textContent = closeReasonText(ev.reason, this.limitS);
        this.els.closeReason.dataset.reason = ev.reason || "";
        break;
      case ServerEvent.ERROR:
        this.notice(errorText(ev.error), "error", ev.error?.code);
        break;
      default:
        break;
    }
  }

  onSocketClosed(code) {
    const c = this.client;
    if (c && this.els.closeReason.textContent === "—") {
      const text = closeReasonText(c.closeReason, this.limitS);
      const generic = c.closeReason === "connection_lost" || c.closeReason === "server_closed";
      const detail = generic ? closeCodeText(code) : "";
      this.els.closeReason.textContent = detail && text !== detail ? `${text} ${detail}` : text;
      this.els.closeReason.dataset.reason = c.closeReason || "";
    }
  }

  showQueue(position, waitS, length) {
    this.els.queue.hidden = false;
    this.els.queuePosition.textContent = String(position);
    this.els.queueWait.textContent =
      typeof waitS === "number" ? (waitS < 60 ? `${waitS} s` : `${clock(waitS)} min`) : "unknown";
    this.els.queue.title = length ? `${length} waiting in all` : "";
  }

  hideQueue() {
    this.els.queue.hidden = true;
  }

  setKv(tokens) {
    const max = this.config.context_tokens || 8192;
    if (tokens == null) {
      this.els.kvMeter.value = 0;
      this.els.kvText.textContent = "—";
      return;
    }
    this.els.kvMeter.max = max;
    this.els.kvMeter.value = Math.min(tokens, max);
    this.els.kvText.textContent = `${tokens.toLocaleString("en")} / ${max.toLocaleString("en")} tokens`;
  }

  setBackend(name) {
    this.els.backend.textContent = name === "scripted" ? "scripted (no model: test output)" : name;
    this.els.backend.dataset.backend = name;
  }

  /** Show a sentence to the user (kind: error, warn or info). */
  notice(text, kind = "info", code = "") {
    const el = this.els.notice;
    el.textContent = text;
    el.dataset.kind = kind;
    el.dataset.code = code || "";
    el.hidden = false;
  }

  clearNotice() {
    this.els.notice.hidden = true;
    this.els.notice.textContent = "";
    this.els.notice.dataset.code = "";
  }
}
