// PCM helpers: base64 float32 (the protocol's audio format) and a streaming resampler.
//
// The protocol carries little-endian float32 mono PCM in base64: 16 kHz from the client,
// 24 kHz from the server. Browsers capture and play at the audio device's rate (often 48 kHz),
// so audio is resampled both ways with a windowed-sinc filter (band-limited: no aliasing when
// going down from 48 kHz to 16 kHz, no imaging when going up from 24 kHz to 48 kHz).

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/** Float32Array -> base64 of its little-endian bytes. */
export function float32ToBase64(samples) {
  let bytes = new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength);
  if (!LITTLE_ENDIAN) {
    const view = new DataView(new ArrayBuffer(samples.length * 4));
    samples.forEach((v, i) => view.setFloat32(i * 4, v, true));
    bytes = new Uint8Array(view.buffer);
  }
  let binary = "";
  const step = 0x8000; // String.fromCharCode takes a bounded number of arguments
  for (let i = 0; i < bytes.length; i += step) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + step));
  }
  return btoa(binary);
}

/** base64 of little-endian float32 bytes -> Float32Array (a trailing partial sample is ignored). */
export function base64ToFloat32(b64) {
  const binary = atob(b64);
  const n = Math.floor(binary.length / 4);
  const view = new DataView(new ArrayBuffer(n * 4));
  for (let i = 0; i < n * 4; i++) view.setUint8(i, binary.charCodeAt(i));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = view.getFloat32(i * 4, true);
  return out;
}

/** Base64 of any bytes (files: images, reference voices). */
export function bytesToBase64(bytes) {
  let binary = "";
  const step = 0x8000;
  for (let i = 0; i < bytes.length; i += step) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + step));
  }
  return btoa(binary);
}

const PHASES = 512; // fractional positions are rounded to 1/512 sample (kernel table rows)

/**
 * Streaming band-limited resampler. push() any number of blocks; the output of consecutive blocks
 * is continuous (the filter keeps its history). flush() returns the last samples.
 */
export class Resampler {
  constructor(inRate, outRate, zeroCrossings = 16) {
    this.inRate = inRate;
    this.outRate = outRate;
    this.step = inRate / outRate; // input samples per output sample
    this.cutoff = Math.min(1, outRate / inRate) * 0.95; // a little below the lower Nyquist
    this.half = Math.ceil(zeroCrossings / this.cutoff); // half kernel width, in input samples
    this.kernels = new Array(PHASES + 1);
    this.reset();
  }

  /** Forget the history (e.g. after playback was flushed). */
  reset() {
    this.buf = new Float32Array(this.half); // zeros before the first sample
    this.pos = this.half; // input position of the next output sample, in buf coordinates
  }

  _kernel(phaseIndex) {
    let k = this.kernels[phaseIndex];
    if (k) return k;
    const frac = phaseIndex / PHASES;
    const c = this.cutoff;
    k = new Float32Array(2 * this.half);
    for (let j = 0; j < k.length; j++) {
      const x = frac + this.half - 1 - j; // distance from the output position to tap j
      const t = x / this.half; // -1..1 over the window
      const window = 0.42 + 0.5 * Math.cos(Math.PI * t) + 0.08 * Math.cos(2 * Math.PI * t);
      const arg = Math.PI * c * x;
      k[j] = c * (arg === 0 ? 1 : Math.sin(arg) / arg) * window;
    }
    this.kernels[phaseIndex] = k;
    return k;
  }

  /** Resample one block; returns the output samples it completes. */
  push(input) {
    if (this.inRate === this.outRate) return Float32Array.from(input);
    const buf = new Float32Array(this.buf.length + input.length);
    buf.set(this.buf);
    buf.set(input, this.buf.length);
    const out = new Float32Array(Math.ceil((buf.length - this.pos) / this.step) + 1);
    let n = 0;
    let pos = this.pos;
    const half = this.half;
    while (pos + half < buf.length) {
      const i0 = Math.floor(pos);
      const kernel = this._kernel(Math.round((pos - i0) * PHASES));
      let acc = 0;
      const first = i0 - half + 1;
      for (let j = 0; j < kernel.length; j++) acc += buf[first + j] * kernel[j];
      out[n++] = acc;
      pos += this.step;
    }
    const keepFrom = Math.max(0, Math.floor(pos) - half);
    this.buf = buf.slice(keepFrom);
    this.pos = pos - keepFrom;
    return out.slice(0, n);
  }

  /** The remaining output, as if the input went on with silence. */
  flush() {
    const out = this.push(new Float32Array(this.half + Math.ceil(this.step)));
    this.reset();
    return out;
  }
}

/** Root mean square level of a block (for the microphone meter). */
export function rms(samples) {
  let sum = 0;
  for (let i = 0; i < samples.length; i++) sum += samples[i] * samples[i];
  return samples.length ? Math.sqrt(sum / samples.length) : 0;
}
