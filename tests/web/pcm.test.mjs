// Unit tests of api/web/pcm.js (run by tests/e2e/test_web_client.py with `node --test`).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Resampler, base64ToFloat32, float32ToBase64 } from "../../api/web/pcm.js";

function sine(freq, rate, seconds, amp = 0.5) {
  const out = new Float32Array(Math.round(rate * seconds));
  for (let i = 0; i < out.length; i++) out[i] = amp * Math.sin((2 * Math.PI * freq * i) / rate);
  return out;
}

function rmsOf(x, from = 0, to = x.length) {
  let s = 0;
  for (let i = from; i < to; i++) s += x[i] * x[i];
  return Math.sqrt(s / (to - from));
}

function zeroCrossings(x, from, to) {
  let n = 0;
  for (let i = from + 1; i < to; i++) if ((x[i - 1] < 0) !== (x[i] < 0)) n++;
  return n;
}

function inBlocks(r, x, size) {
  const parts = [];
  for (let i = 0; i < x.length; i += size) parts.push(r.push(x.subarray(i, i + size)));
  parts.push(r.flush());
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

test("base64 float32 round trip is exact and little-endian", () => {
  const x = Float32Array.from([0, 1, -1, 0.5, -0.25, 1e-7, 3.4e38]);
  const b64 = float32ToBase64(x);
  assert.deepEqual(base64ToFloat32(b64), x);
  assert.equal(Buffer.from(b64, "base64").readFloatLE(12), 0.5);
});

test("48 kHz -> 16 kHz keeps a 1 kHz tone: length, pitch and level", () => {
  const out = inBlocks(new Resampler(48000, 16000), sine(1000, 48000, 1), 2048);
  assert.ok(Math.abs(out.length - 16000) <= 8, `length ${out.length}`);
  // 1 kHz: 2000 zero crossings per second, measured away from the edges
  const zc = zeroCrossings(out, 1000, 15000);
  assert.ok(Math.abs(zc - 1750) <= 2, `zero crossings ${zc}`);
  assert.ok(Math.abs(rmsOf(out, 1000, 15000) - 0.5 / Math.SQRT2) < 0.01);
});

test("48 kHz -> 16 kHz removes a 12 kHz tone instead of aliasing it to 4 kHz", () => {
  const out = inBlocks(new Resampler(48000, 16000), sine(12000, 48000, 1), 2048);
  assert.ok(rmsOf(out, 1000, 15000) < 0.01, `alias level ${rmsOf(out, 1000, 15000)}`);
});

test("24 kHz -> 48 kHz and 44.1 kHz -> 16 kHz keep the tone", () => {
  const up = inBlocks(new Resampler(24000, 48000), sine(440, 24000, 1), 1000);
  assert.ok(Math.abs(up.length - 48000) <= 4);
  assert.ok(Math.abs(rmsOf(up, 2000, 46000) - 0.5 / Math.SQRT2) < 0.01);
  const odd = inBlocks(new Resampler(44100, 16000), sine(440, 44100, 1), 441);
  assert.ok(Math.abs(odd.length - 16000) <= 8);
  assert.ok(Math.abs(zeroCrossings(odd, 800, 15200) - 792) <= 2);
});

test("block size does not change the output", () => {
  const x = sine(700, 48000, 0.5);
  const a = inBlocks(new Resampler(48000, 16000), x, 128);
  const b = inBlocks(new Resampler(48000, 16000), x, 24000);
  assert.equal(a.length, b.length);
  for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i] - b[i]) < 1e-6);
});
