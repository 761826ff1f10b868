// Chat mode: a transcript, text input, image upload and hold-to-talk audio messages; streamed
// text and optional speech. Each turn sends the whole conversation (chat turns are stateless on
// the server), so the transcript is the context.

import { INPUT_RATE, Microphone, Player, mediaErrorText } from "./audio.js";
import { errorText, isFatal } from "./messages.js";
import { base64ToFloat32, bytesToBase64, float32ToBase64 } from "./pcm.js";
import { CloseReason, DeltaKind, ServerEvent } from "./protocol.js";
import { RealtimeClient } from "./realtime.js";

const MIN_TALK_S = 0.3;
const MAX_IMAGE_BYTES = 8 * 1024 * 1024;

export class ChatView {
  /**
   * @param {object} opts
   * @param {() => object} opts.sessionOptions {mode, apiKey, initPayload}
   * @param {() => object} opts.turnOptions {systemPrompt, streaming, generation, tts}
   * @param {import("./status.js").StatusPanel} opts.status
   * @param {object} opts.els form, text, image, imageName, send, talk, end, transcript, played
   * @param {(busy: boolean) => void} opts.onBusy
   */
  constructor({ sessionOptions, turnOptions, status, els, onBusy }) {
    this.sessionOptions = sessionOptions;
    this.turnOptions = turnOptions;
    this.status = status;
    this.els = els;
    this.onBusy = onBusy;
    this.client = null;
    this.history = []; // messages the server has answered
    this.turn = null; // {message, bubble, text}
    this.player = new Player({
      onStats: (s) => {
        els.played.textContent = s.played.toFixed(1);
      },
    });
    els.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.sendText();
    });
    els.text.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        this.sendText();
      }
    });
    els.image.addEventListener("change", () => {
      const f = els.image.files[0];
      els.imageName.textContent = f ? f.name : "";
    });
    els.end.addEventListener("click", () => this.end());
    this.bindTalk(els.talk);
    this.setBusy(false);
  }

  // ------------------------------------------------------------------ connection
  async connected() {
    if (this.client && this.client.state === "active") return this.client;
    if (this.client && this.client.state !== "closed") return this.waitActive(this.client);
    const opts = this.sessionOptions();
    this.status.reset("chat");
    const client = new RealtimeClient(opts);
    this.client = client;
    this.status.bind(client);
    client.addEventListener("server", (e) => this.onServer(e.detail));
    client.addEventListener("state", (e) => {
      if (e.detail.state === "closed") this.onClosed();
    });
    client.connect();
    return this.waitActive(client);
  }

  waitActive(client) {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (client.state === "active") {
          client.removeEventListener("state", check);
          resolve(client);
        } else if (client.state === "closed") {
          client.removeEventListener("state", check);
          reject(new Error("closed"));
        }
      };
      client.addEventListener("state", check);
      check();
    });
  }

  end() {
    if (this.client && this.client.state !== "closed") this.client.close(CloseReason.USER_STOP);
  }

  onClosed() {
    if (this.turn) this.failTurn("The session ended before the answer was complete.");
    this.els.end.disabled = true;
    this.onBusy(false);
  }

  // ------------------------------------------------------------------ sending
  async sendText() {
    const text = this.els.text.value.trim();
    const file = this.els.image.files[0];
    if (!text && !file) return;
    let content = text;
    if (file) {
      if (file.size > MAX_IMAGE_BYTES) {
        this.status.notice("The image is larger than 8 MB; choose a smaller one.", "error");
        return;
      }
      const data = bytesToBase64(new Uint8Array(await file.arrayBuffer()));
      content = [];
      if (text) content.push({ type: "text", text });
      content.push({ type: "image", data });
    }
    this.els.text.value = "";
    this.els.image.value = "";
    this.els.imageName.textContent = "";
    const label = file ? `${text}${text ? " " : ""}[image: ${file.name}]` : text;
    await this.sendMessage({ role: "user", content }, label);
  }

  /** Send one user message; ``voice``: it is a recording, labelled until its transcript comes. */
  async sendMessage(message, label, voice = false) {
    if (this.turn) return;
    this.status.clearNotice();
    const bubble = this.addBubble("user", label);
    const answer = this.addBubble("assistant", "");
    answer.classList.add("pending");
    this.turn = { message, bubble, answer, text: "", responseId: null, voice };
    this.setBusy(true);
    try {
      await this.player.start();
      const client = await this.connected();
      const o = this.turnOptions();
      const messages = [];
      if (o.systemPrompt) messages.push({ role: "system", content: o.systemPrompt });
      messages.push(...this.history, message);
      const input = { messages, streaming: o.streaming, generation: o.generation, tts: o.tts };
      if (!client.sendTurn(input)) throw new Error("not sent");
      this.els.end.disabled = false;
      this.onBusy(true);
    } catch {
      this.failTurn("Could not reach the server for this message.");
    }
  }

  // ------------------------------------------------------------------ receiving
  onServer(ev) {
    const t = this.turn;
    if (ev.type === ServerEvent.ERROR) {
      if (t && !isFatal(ev.error?.code)) this.failTurn(errorText(ev.error));
      return;
    }
    if (!t) return;
    if (ev.type === ServerEvent.RESPONSE_OUTPUT_DELTA) {
      t.answer.classList.remove("pending");
      if (ev.kind === DeltaKind.TEXT) {
        t.text += ev.text;
        t.answer.querySelector(".text").textContent = t.text;
      } else if (ev.kind === DeltaKind.AUDIO) {
        this.player.push(base64ToFloat32(ev.audio));
      }
      this.scroll();
    } else if (ev.type === ServerEvent.RESPONSE_DONE) {
      t.answer.classList.remove("pending");
      const text = ev.text || t.text;
      t.answer.querySelector(".text").textContent = text;
      if (ev.audio) this.player.push(base64ToFloat32(ev.audio)); // non-streaming speech
      const m = ev.metrics || {};
      if (t.voice && m.transcript) this.showHeard(t, m.transcript);
      const facts = [];
      if (m.backend) facts.push(m.backend);
      if (m.generated_tokens != null) facts.push(`${m.generated_tokens} tokens`);
      if (m.total_s != null) facts.push(`${Number(m.total_s).toFixed(1)} s`);
      t.answer.querySelector(".meta").textContent = facts.join(" · ");
      this.history.push(t.message, { role: "assistant", content: text });
      this.turn = null;
      this.setBusy(false);
      this.els.text.focus();
    }
  }

  failTurn(text) {
    const t = this.turn;
    if (!t) return;
    t.answer.classList.remove("pending");
    t.answer.classList.add("failed");
    t.answer.querySelector(".text").textContent = text;
    t.bubble.classList.add("failed"); // not part of the conversation sent next time
    this.turn = null;
    this.setBusy(false);
  }

  // ------------------------------------------------------------------ hold to talk
  bindTalk(button) {
    const down = (e) => {
      if (e.type === "keydown" && ((e.key !== " " && e.key !== "Enter") || e.repeat)) return;
      e.preventDefault();
      this.talkStart();
    };
    const up = (e) => {
      if (e.type === "keyup" && e.key !== " " && e.key !== "Enter") return;
      e.preventDefault();
      this.talkEnd();
    };
    button.addEventListener("pointerdown", down);
    button.addEventListener("pointerup", up);
    button.addEventListener("pointerleave", () => this.talking && this.talkEnd());
    button.addEventListener("pointercancel", () => this.talking && this.talkEnd());
    button.addEventListener("keydown", down);
    button.addEventListener("keyup", up);
    button.addEventListener("click", (e) => e.preventDefault());
  }

  async talkStart() {
    if (this.talking || this.turn) return;
    this.talking = true;
    this.els.talk.setAttribute("aria-pressed", "true");
    this.els.talk.querySelector(".label").textContent = "Recording… release to send";
    this.status.clearNotice();
    this.recorder = new Microphone({ chunkSamples: 0 });
    try {
      this.recordStarting = this.recorder.start();
      await this.recordStarting;
    } catch (err) {
      this.status.notice(mediaErrorText(err, "microphone"), "error");
      this.resetTalk();
    }
  }

  async talkEnd() {
    if (!this.talking) return;
    const rec = this.recorder;
    try {
      await this.recordStarting;
    } catch {
      return;
    }
    this.resetTalk();
    const pcm = rec.drain();
    rec.stop();
    const seconds = pcm.length / INPUT_RATE;
    if (seconds < MIN_TALK_S) {
      this.status.notice("Hold the button while you speak, then release it to send.", "info");
      return;
    }
    const content = [{ type: "audio", data: float32ToBase64(pcm), sample_rate: INPUT_RATE }];
    const label = `Voice message (${seconds.toFixed(1)} s)`;
    await this.sendMessage({ role: "user", content }, label, true);
  }

  /** The recognised words of a voice message become its line; the label moves to its meta. */
  showHeard(turn, transcript) {
    const text = turn.bubble.querySelector(".text");
    turn.bubble.querySelector(".meta").textContent = text.textContent;
    text.textContent = transcript;
  }

  resetTalk() {
    this.talking = false;
    this.els.talk.setAttribute("aria-pressed", "false");
    this.els.talk.querySelector(".label").textContent = "Hold to talk";
  }

  // ------------------------------------------------------------------ transcript
  addBubble(role, text) {
    const item = document.createElement("div");
    item.className = `bubble ${role}`;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Assistant";
    const body = document.createElement("p");
    body.className = "text";
    body.textContent = text;
    const meta = document.createElement("span");
    meta.className = "meta";
    item.append(who, body, meta);
    this.els.transcript.append(item);
    this.scroll();
    return item;
  }

  scroll() {
    const box = this.els.transcript;
    box.scrollTop = box.scrollHeight;
  }

  setBusy(busy) {
    this.els.send.disabled = busy;
    this.els.talk.disabled = busy;
  }
}
