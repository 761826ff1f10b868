// Audio and video full-duplex: the microphone streams 1 s chunks (with a camera frame in video
// mode) while the model's speech plays and its text shows as captions.

import { Microphone, OUTPUT_RATE, Player, mediaErrorText } from "./audio.js";
import { Camera } from "./camera.js";
import { base64ToFloat32 } from "./pcm.js";
import { CloseReason, DeltaKind, ServerEvent } from "./protocol.js";
import { RealtimeClient } from "./realtime.js";

const MAX_CAPTIONS = 60;

export class DuplexView {
  /**
   * @param {object} opts
   * @param {() => {mode: string, apiKey: string, initPayload: object}} opts.sessionOptions
   * @param {import("./status.js").StatusPanel} opts.status
   * @param {object} opts.els start, stop, interrupt, captions, level, sent, framesSent, received,
   *   played, speaking,
   *   preview (video element), previewBox
   * @param {(busy: boolean) => void} opts.onBusy called when a session starts and ends
   */
  constructor({ sessionOptions, status, els, onBusy }) {
    this.sessionOptions = sessionOptions;
    this.status = status;
    this.els = els;
    this.onBusy = onBusy;
    this.client = null;
    this.camera = new Camera(els.preview);
    this.player = new Player({ onStats: (s) => this.onPlayerStats(s) });
    els.start.addEventListener("click", () => this.start());
    els.stop.addEventListener("click", () => this.stop());
    els.interrupt.addEventListener("click", () => this.interrupt());
    this.setButtons("idle");
  }

  setMode(mode) {
    this.mode = mode;
    this.els.previewBox.hidden = mode !== "video";
  }

  setButtons(phase) {
    const running = phase === "running";
    this.els.start.disabled = running || phase === "starting";
    this.els.stop.disabled = !running && phase !== "starting";
    this.els.interrupt.disabled = !running;
  }

  async start() {
    const opts = this.sessionOptions();
    this.setButtons("starting");
    this.onBusy(true);
    this.status.reset(opts.mode);
    this.els.captions.replaceChildren();
    this.sentChunks = 0;
    this.sentFrames = 0;
    this.receivedS = 0;
    this.els.received.textContent = "0.0";
    this.forceListen = false;
    this.els.sent.textContent = "0";
    this.els.framesSent.textContent = "0";
    this.mic = new Microphone({
      onChunk: (pcm) => this.onChunk(pcm),
      onLevel: (level) => {
        this.els.level.value = Math.min(1, level * 4);
      },
    });
    try {
      await this.mic.start();
    } catch (err) {
      return this.failStart(mediaErrorText(err, "microphone"));
    }
    if (opts.mode === "video") {
      try {
        await this.camera.start();
      } catch (err) {
        this.mic.stop();
        return this.failStart(mediaErrorText(err, "camera"));
      }
    }
    await this.player.start();
    const client = new RealtimeClient(opts);
    this.client = client;
    this.status.bind(client);
    client.addEventListener("server", (e) => this.onServer(e.detail));
    client.addEventListener("state", (e) => this.onState(e.detail.state));
    client.connect();
    this.setButtons("running");
  }

  failStart(text) {
    this.status.notice(text, "error");
    this.setButtons("idle");
    this.onBusy(false);
  }

  onState(state) {
    if (state === "active") this.mic.discard(); // speech from before the session is stale
    if (state === "reconnecting" || state === "recovering") this.flushPlayback(state);
    if (state === "closed") this.teardown();
  }

  /** One second of microphone audio at 16 kHz: send it (with a frame in video mode). */
  onChunk(pcm) {
    const c = this.client;
    if (!c || !c.ready) return; // before session.created, or while reconnecting: dropped
    const frames = [];
    if (this.mode === "video") {
      const frame = this.camera.frame();
      if (frame) frames.push(frame);
    }
    if (c.appendAudio(pcm, { frames, forceListen: this.forceListen })) {
      this.forceListen = false;
      this.sentChunks += 1;
      this.sentFrames += frames.length;
      this.els.sent.textContent = String(this.sentChunks);
      this.els.framesSent.textContent = String(this.sentFrames);
    }
  }

  onServer(ev) {
    if (ev.type !== ServerEvent.RESPONSE_OUTPUT_DELTA) return;
    // a transcribing backend names what it heard on the first step of its answer
    const heard = ev.metrics?.transcript;
    if (heard && ev.kind !== DeltaKind.LISTEN && ev.response_id !== this.heardFor) {
      this.heardFor = ev.response_id;
      this.userLine(heard);
    }
    if (ev.kind === DeltaKind.LISTEN) {
      // The spec: stop queued playback when the model listens again. The exception is audio of
      // a response the model finished itself (end_of_turn on a delta of its own step): the
      // listens after it are the announced switch back to listening, and a backend that speaks
      // faster than real time (pocket) would otherwise lose the rest of every answer. A response
      // cut short (force_listen, barge-in) ends with a flush delta marked metrics.interrupted.
      if (!this.finishedTurn) this.flushPlayback(`listen ${ev.input_id} after ${this.lastDelta}`);
      this.endCaption();
      this.els.speaking.dataset.speaking = "false";
      this.els.speaking.textContent = "Listening";
    } else if (ev.kind === DeltaKind.TEXT) {
      this.caption(ev.response_id).textContent += ev.text;
    } else if (ev.kind === DeltaKind.AUDIO) {
      const pcm = base64ToFloat32(ev.audio);
      this.player.push(pcm);
      this.receivedS += pcm.length / OUTPUT_RATE;
      this.els.received.textContent = this.receivedS.toFixed(1);
      this.els.speaking.dataset.speaking = "true";
      this.els.speaking.textContent = "Speaking";
    }
    if (ev.kind !== DeltaKind.LISTEN) {
      // whether what is queued now belongs to a response its model finished
      this.finishedTurn = Boolean(ev.metrics?.end_of_turn) && !ev.metrics?.interrupted;
      this.lastDelta = `${ev.kind} ${ev.input_id} end=${ev.metrics?.end_of_turn}`;
    }
    if (ev.metrics?.end_of_turn) this.endCaption();
  }

  /** Stop queued playback; the reason is kept on the page for inspection (data-last-flush). */
  flushPlayback(reason) {
    this.player.flush();
    this.els.played.dataset.lastFlush = reason;
  }

  /** The user's words, as a line of the conversation before the answer's caption. */
  userLine(text) {
    this.endCaption();
    const p = document.createElement("p");
    p.className = "caption user";
    p.textContent = text;
    this.appendCaption(p);
  }

  appendCaption(p) {
    const box = this.els.captions;
    box.append(p);
    while (box.children.length > MAX_CAPTIONS) box.firstElementChild.remove();
    box.scrollTop = box.scrollHeight;
  }

  caption(responseId) {
    const box = this.els.captions;
    let p = this.current;
    if (!p || p.dataset.response !== String(responseId)) {
      p = document.createElement("p");
      p.className = "caption";
      p.dataset.response = String(responseId);
      this.appendCaption(p);
      this.current = p;
    }
    box.scrollTop = box.scrollHeight;
    return p;
  }

  endCaption() {
    if (this.current) this.current.classList.add("done");
    this.current = null;
  }

  onPlayerStats(s) {
    this.els.played.textContent = s.played.toFixed(1);
    // for tests and for anyone debugging playback in the browser's inspector
    Object.assign(this.els.played.dataset, {
      queued: s.queued.toFixed(2),
      starts: s.starts,
      flushes: s.flushes,
      context: `${s.context} ${s.contextTime.toFixed(1)}`,
    });
  }

  /** Stop the model's speech now: local playback at once, force_listen with the next chunk. */
  interrupt() {
    this.flushPlayback("interrupt");
    this.finishedTurn = false;
    this.forceListen = true;
    this.endCaption();
  }

  stop() {
    if (this.client && this.client.state !== "closed") this.client.close(CloseReason.USER_STOP);
    else this.teardown();
  }

  teardown() {
    this.mic?.stop();
    this.camera.stop();
    this.els.level.value = 0;
    this.els.speaking.dataset.speaking = "false";
    this.els.speaking.textContent = "—";
    this.setButtons("idle");
    this.onBusy(false);
  }
}
