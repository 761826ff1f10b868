// Camera for video duplex: a live preview and one JPEG frame (base64) per input chunk.

const MAX_WIDTH = 640; // frames are scaled down to this width before encoding
const JPEG_QUALITY = 0.8;

export class Camera {
  /** @param {HTMLVideoElement} preview */
  constructor(preview) {
    this.preview = preview;
    this.stream = null;
    this.canvas = document.createElement("canvas");
  }

  async start() {
    this.stream = await navigator.mediaDevices.getUserMedia({
      video: { width: { ideal: 1280 }, height: { ideal: 720 }, facingMode: "user" },
    });
    this.preview.srcObject = this.stream;
    await this.preview.play();
  }

  /** The current picture as base64 JPEG (no data: prefix), or null before the first frame. */
  frame() {
    const v = this.preview;
    if (!this.stream || !v.videoWidth) return null;
    const scale = Math.min(1, MAX_WIDTH / v.videoWidth);
    this.canvas.width = Math.round(v.videoWidth * scale);
    this.canvas.height = Math.round(v.videoHeight * scale);
    this.canvas.getContext("2d").drawImage(v, 0, 0, this.canvas.width, this.canvas.height);
    const url = this.canvas.toDataURL("image/jpeg", JPEG_QUALITY);
    return url.slice(url.indexOf(",") + 1);
  }

  stop() {
    this.stream?.getTracks().forEach((t) => t.stop());
    this.stream = null;
    this.preview.srcObject = null;
  }
}
