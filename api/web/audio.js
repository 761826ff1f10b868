// Microphone capture (16 kHz chunks for the server) and speech playback (24 kHz from the server)
// on one AudioContext running at the device's own rate.

import { Resampler, rms } from "./pcm.js";

export const INPUT_RATE = 16000; // what the server takes
export const OUTPUT_RATE = 24000; // what the server sends

let sharedContext = null;

/** The page's AudioContext, created (and resumed) on a user gesture. */
export async function audioContext() {
  if (!sharedContext) {
    sharedContext = new AudioContext({ latencyHint: "interactive" });
    const base = new URL("./worklets/", import.meta.url);
    await sharedContext.audioWorklet.addModule(new URL("capture.js", base));
    await sharedContext.audioWorklet.addModule(new URL("player.js", base));
  }
  if (sharedContext.state !== "running") await sharedContext.resume();
  return sharedContext;
}

/** A user-facing sentence for a getUserMedia failure. */
export function mediaErrorText(err, what) {
  if (!window.isSecureContext) {
    return `The browser allows the ${what} only on secure (https) pages or on localhost.`;
  }
  switch (err?.name) {
    case "NotAllowedError":
    case "SecurityError":
      return `Access to the ${what} was refused. Allow it in the browser's site settings and try again.`;
    case "NotFoundError":
    case "OverconstrainedError":
      return `No ${what} was found on this device.`;
    case "NotReadableError":
      return `The ${what} is in use by another program.`;
    default:
      return `The ${what} could not be opened (${err?.message || err}).`;
  }
}

/**
 * Microphone capture. Calls onChunk(Float32Array of `chunkSamples` at 16 kHz) every time that many
 * samples are complete (every second for duplex), and onLevel(rms) for a level meter.
 */
export class Microphone {
  constructor({ chunkSamples = INPUT_RATE, onChunk = () => {}, onLevel = () => {} } = {}) {
    this.chunkSamples = chunkSamples;
    this.onChunk = onChunk;
    this.onLevel = onLevel;
    this.pending = [];
    this.pendingLength = 0;
    this.stream = null;
  }

  async start() {
    const ctx = await audioContext();
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: {
        channelCount: 1,
        echoCancellation: true, // the model's own voice must not reach it as user speech
        noiseSuppression: true,
        autoGainControl: true,
      },
    });
    this.resampler = new Resampler(ctx.sampleRate, INPUT_RATE);
    this.source = ctx.createMediaStreamSource(this.stream);
    this.node = new AudioWorkletNode(ctx, "omni-capture", { numberOfOutputs: 1 });
    // Pull the node through a silent gain so every browser keeps calling process().
    this.sink = ctx.createGain();
    this.sink.gain.value = 0;
    this.source.connect(this.node).connect(this.sink).connect(ctx.destination);
    this.node.port.onmessage = (e) => this._block(e.data);
  }

  _block(block) {
    this.onLevel(rms(block));
    const pcm = this.resampler.push(block);
    this.pending.push(pcm);
    this.pendingLength += pcm.length;
    while (this.chunkSamples && this.pendingLength >= this.chunkSamples) {
      this.onChunk(this._take(this.chunkSamples));
    }
  }

  _take(n) {
    const out = new Float32Array(n);
    let filled = 0;
    while (filled < n) {
      const head = this.pending[0];
      const k = Math.min(n - filled, head.length);
      out.set(head.subarray(0, k), filled);
      filled += k;
      if (k === head.length) this.pending.shift();
      else this.pending[0] = head.subarray(k);
    }
    this.pendingLength -= n;
    return out;
  }

  /** Everything captured and not yet handed out (hold-to-talk takes it all at release). */
  drain() {
    const tail = this.resampler ? this.resampler.flush() : new Float32Array(0);
    this.pending.push(tail);
    this.pendingLength += tail.length;
    return this._take(this.pendingLength);
  }

  /** Throw away what was captured so far (audio from before the session was ready). */
  discard() {
    this.pending = [];
    this.pendingLength = 0;
  }

  stop() {
    this.node?.port.close();
    this.source?.disconnect();
    this.node?.disconnect();
    this.sink?.disconnect();
    this.stream?.getTracks().forEach((t) => t.stop());
    this.stream = null;
  }
}

/**
 * Speech playback through the player worklet: push() 24 kHz blocks as they arrive; they play
 * without gaps. flush() stops what is queued (on kind "listen"). onStats({played, queued,
 * playing, starts, flushes, context, contextTime}) reports progress about ten times a second.
 */
export class Player {
  constructor({ onStats = () => {} } = {}) {
    this.onStats = onStats;
    this.node = null;
  }

  async start() {
    const ctx = await audioContext();
    if (this.node) return;
    this.resampler = new Resampler(OUTPUT_RATE, ctx.sampleRate);
    this.node = new AudioWorkletNode(ctx, "omni-player", {
      numberOfInputs: 0,
      outputChannelCount: [ctx.destination.channelCount >= 2 ? 2 : 1],
      processorOptions: { prebufferS: 0.12 },
    });
    this.node.port.onmessage = (e) =>
      this.onStats({ ...e.data, context: ctx.state, contextTime: ctx.currentTime });
    this.node.connect(ctx.destination);
  }

  /** Queue 24 kHz float32 samples. */
  push(pcm24k) {
    if (!this.node || !pcm24k.length) return;
    const pcm = this.resampler.push(pcm24k);
    if (pcm.length) this.node.port.postMessage({ type: "push", pcm }, [pcm.buffer]);
  }

  /** Stop queued playback now. */
  flush() {
    this.resampler?.reset();
    this.node?.port.postMessage({ type: "flush" });
  }

  stop() {
    this.flush();
    this.node?.disconnect();
    this.node = null;
  }
}

/** Decode an uploaded audio file (any format the browser reads) to 16 kHz mono float32. */
export async function decodeFileTo16k(file) {
  const ctx = await audioContext();
  const decoded = await ctx.decodeAudioData(await file.arrayBuffer());
  const mono = new Float32Array(decoded.length);
  for (let c = 0; c < decoded.numberOfChannels; c++) {
    const data = decoded.getChannelData(c);
    for (let i = 0; i < data.length; i++) mono[i] += data[i] / decoded.numberOfChannels;
  }
  const resampler = new Resampler(decoded.sampleRate, INPUT_RATE);
  const head = resampler.push(mono);
  const tail = resampler.flush();
  const out = new Float32Array(head.length + tail.length);
  out.set(head);
  out.set(tail, head.length);
  return out;
}
