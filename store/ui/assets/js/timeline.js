// The selection's total over time, as an area chart on a <canvas>.
// Dragging across it ("brushing") reports a narrower time range.

import { formatAxisTime, formatDateTime, formatValue } from './format.js';

const HEIGHT = 96;
const PAD_LEFT = 56;
const PAD_RIGHT = 8;
const PAD_TOP = 8;
const PAD_BOTTOM = 20;

export class TimelineChart {
  constructor({ container, canvas, info, color, onBrush }) {
    this.container = container;
    this.canvas = canvas;
    this.info = info;
    this.color = color || '#ea580c';
    this.onBrush = onBrush || (() => {});
    this.ctx = canvas.getContext('2d');
    this.data = null;
    this.range = null;
    this.unit = '';
    this.brush = null;
    this.hoverStep = -1;
    canvas.addEventListener('mousedown', (e) => this.onDown(e));
    window.addEventListener('mousemove', (e) => this.onMove(e));
    window.addEventListener('mouseup', (e) => this.onUp(e));
    canvas.addEventListener('mouseleave', () => {
      this.hoverStep = -1;
      this.draw();
    });
    new ResizeObserver(() => this.draw()).observe(container);
  }

  // `timeline` is kiln-engine's {start_ms, step_ms, values}; `range` the
  // queried {startMs, endMs}; `aggregation` the store's `sum` or `average`
  // (a gauge such as heap in use: each step's mean profile).
  setData(timeline, range, unit, aggregation) {
    this.data = timeline;
    this.range = range;
    this.unit = unit || '';
    this.aggregation = aggregation || 'sum';
    this.hoverStep = -1;
    this.draw();
  }

  clear() {
    this.data = null;
    this.draw();
  }

  plotWidth() {
    return Math.max(10, this.cssWidth - PAD_LEFT - PAD_RIGHT);
  }

  timeAt(px) {
    const { startMs, endMs } = this.range;
    const f = Math.min(1, Math.max(0, (px - PAD_LEFT) / this.plotWidth()));
    return startMs + f * (endMs - startMs);
  }

  xOf(ms) {
    const { startMs, endMs } = this.range;
    return PAD_LEFT + ((ms - startMs) / (endMs - startMs)) * this.plotWidth();
  }

  localX(event) {
    return event.clientX - this.canvas.getBoundingClientRect().left;
  }

  onDown(event) {
    if (!this.range || event.button !== 0) return;
    const x = this.localX(event);
    this.brush = { from: x, to: x };
    event.preventDefault();
  }

  onMove(event) {
    if (!this.range) return;
    const x = this.localX(event);
    if (this.brush) {
      this.brush.to = x;
      this.draw();
      return;
    }
    const rect = this.canvas.getBoundingClientRect();
    if (event.clientY < rect.top || event.clientY > rect.bottom || x < PAD_LEFT || x > rect.width) return;
    if (this.data && this.data.values.length) {
      const t = this.timeAt(x);
      const step = Math.floor((t - this.data.start_ms) / this.data.step_ms);
      if (step !== this.hoverStep) {
        this.hoverStep = step;
        this.draw();
      }
    }
  }

  onUp() {
    if (!this.brush) return;
    const { from, to } = this.brush;
    this.brush = null;
    this.draw();
    if (Math.abs(to - from) < 4) return;
    const a = this.timeAt(Math.min(from, to));
    const b = this.timeAt(Math.max(from, to));
    this.onBrush(Math.floor(a), Math.ceil(b));
  }

  draw() {
    const dpr = window.devicePixelRatio || 1;
    const width = Math.max(200, this.container.clientWidth);
    this.cssWidth = width;
    if (this.canvas.width !== Math.round(width * dpr) || this.canvas.height !== Math.round(HEIGHT * dpr)) {
      this.canvas.width = Math.round(width * dpr);
      this.canvas.height = Math.round(HEIGHT * dpr);
      this.canvas.style.width = `${width}px`;
      this.canvas.style.height = `${HEIGHT}px`;
    }
    const ctx = this.ctx;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, HEIGHT);
    ctx.font = '11px system-ui, sans-serif';
    const plotW = this.plotWidth();
    const plotH = HEIGHT - PAD_TOP - PAD_BOTTOM;
    ctx.strokeStyle = '#e5e7eb';
    ctx.strokeRect(PAD_LEFT + 0.5, PAD_TOP + 0.5, plotW, plotH);
    if (!this.range) return;
    const { startMs, endMs } = this.range;
    const span = endMs - startMs;
    // Time axis: about one label per 120 px.
    ctx.fillStyle = '#6b7280';
    ctx.textBaseline = 'top';
    ctx.textAlign = 'center';
    const ticks = Math.max(2, Math.floor(plotW / 120));
    for (let i = 0; i <= ticks; i += 1) {
      const t = startMs + (span * i) / ticks;
      const x = PAD_LEFT + (plotW * i) / ticks;
      ctx.fillText(formatAxisTime(t, span), Math.min(Math.max(x, PAD_LEFT + 24), width - 30), HEIGHT - PAD_BOTTOM + 5);
    }
    const values = this.data ? this.data.values : [];
    const max = values.reduce((m, v) => Math.max(m, v), 0);
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    ctx.fillText(formatValue(max, this.unit), PAD_LEFT - 6, PAD_TOP + 6);
    ctx.fillText('0', PAD_LEFT - 6, PAD_TOP + plotH - 2);
    if (max > 0) {
      const { start_ms: first, step_ms: step } = this.data;
      const yOf = (v) => PAD_TOP + plotH - (v / max) * (plotH - 4);
      ctx.save();
      ctx.beginPath();
      ctx.rect(PAD_LEFT, PAD_TOP, plotW, plotH);
      ctx.clip();
      ctx.globalAlpha = 0.28;
      ctx.fillStyle = this.color;
      ctx.beginPath();
      ctx.moveTo(this.xOf(first), PAD_TOP + plotH);
      for (let i = 0; i < values.length; i += 1) {
        ctx.lineTo(this.xOf(first + i * step), yOf(values[i]));
        ctx.lineTo(this.xOf(first + (i + 1) * step), yOf(values[i]));
      }
      ctx.lineTo(this.xOf(first + values.length * step), PAD_TOP + plotH);
      ctx.fill();
      ctx.globalAlpha = 1;
      ctx.strokeStyle = this.color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      for (let i = 0; i < values.length; i += 1) {
        const y = yOf(values[i]);
        if (i === 0) ctx.moveTo(this.xOf(first), y);
        else ctx.lineTo(this.xOf(first + i * step), y);
        ctx.lineTo(this.xOf(first + (i + 1) * step), y);
      }
      ctx.stroke();
      ctx.restore();
      if (this.hoverStep >= 0 && this.hoverStep < values.length) {
        const t = first + this.hoverStep * step;
        ctx.fillStyle = 'rgba(17, 24, 39, 0.08)';
        ctx.fillRect(this.xOf(t), PAD_TOP, Math.max(1, this.xOf(t + step) - this.xOf(t)), plotH);
        const mean = this.aggregation === 'average' ? ' (mean per profile)' : '';
        this.info.textContent = `${formatDateTime(t)} · ${formatValue(values[this.hoverStep], this.unit)}${mean}`;
      } else {
        this.info.textContent = 'Drag across the chart to narrow the time range.';
      }
    } else {
      ctx.textAlign = 'center';
      ctx.fillText(this.data ? 'No data in this range' : '', PAD_LEFT + plotW / 2, PAD_TOP + plotH / 2);
      this.info.textContent = '';
    }
    if (this.brush) {
      const a = Math.max(PAD_LEFT, Math.min(this.brush.from, this.brush.to));
      const b = Math.min(PAD_LEFT + plotW, Math.max(this.brush.from, this.brush.to));
      ctx.fillStyle = 'rgba(37, 99, 235, 0.15)';
      ctx.fillRect(a, PAD_TOP, b - a, plotH);
      ctx.strokeStyle = 'rgba(37, 99, 235, 0.8)';
      ctx.strokeRect(a + 0.5, PAD_TOP + 0.5, b - a, plotH);
    }
  }
}
