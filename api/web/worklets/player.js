// AudioWorklet: a gapless playback queue. The page pushes PCM blocks (already at the context's
// rate); they play back to back. "flush" drops everything queued (the spec: on kind "listen" the
// client stops queued playback). A short pre-buffer before each start absorbs network jitter.
// Every ~100 ms it reports what it played, so the page can show it.

class PlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const prebufferS = options.processorOptions?.prebufferS ?? 0.12;
    this.prebuffer = Math.round(prebufferS * sampleRate);
    this.queue = [];
    this.offset = 0; // read position in queue[0]
    this.queued = 0; // samples waiting
    this.playing = false;
    this.waited = 0; // samples of time spent waiting for the pre-buffer
    this.played = 0; // samples played since the node was created
    this.starts = 0; // how often playback (re)started after running dry
    this.flushes = 0;
    this.sinceReport = 0;
    this.port.onmessage = (e) => {
      const msg = e.data;
      if (msg.type === "push") {
        this.queue.push(msg.pcm);
        this.queued += msg.pcm.length;
      } else if (msg.type === "flush") {
        if (this.queued > 0) this.flushes += 1;
        this.queue = [];
        this.offset = 0;
        this.queued = 0;
        this.playing = false;
        this.report();
      }
    };
  }

  report() {
    this.sinceReport = 0;
    this.port.postMessage({
      played: this.played / sampleRate,
      queued: this.queued / sampleRate,
      playing: this.playing,
      starts: this.starts,
      flushes: this.flushes,
    });
  }

  process(_inputs, outputs) {
    const out = outputs[0];
    const frames = out[0].length;
    const ch0 = out[0];
    ch0.fill(0);
    if (!this.playing && this.queued > 0) {
      this.waited += frames;
      if (this.queued >= this.prebuffer || this.waited >= this.prebuffer) {
        this.playing = true;
        this.waited = 0;
        this.starts += 1;
      }
    }
    if (this.playing) {
      let i = 0;
      while (i < frames && this.queue.length) {
        const head = this.queue[0];
        const n = Math.min(frames - i, head.length - this.offset);
        ch0.set(head.subarray(this.offset, this.offset + n), i);
        i += n;
        this.offset += n;
        this.queued -= n;
        if (this.offset === head.length) {
          this.queue.shift();
          this.offset = 0;
        }
      }
      this.played += i;
      if (!this.queue.length) this.playing = false; // ran dry: pre-buffer again next time
    }
    for (let c = 1; c < out.length; c++) out[c].set(ch0);
    this.sinceReport += frames;
    if (this.sinceReport >= sampleRate / 10) this.report();
    return true;
  }
}

registerProcessor("omni-player", PlayerProcessor);
