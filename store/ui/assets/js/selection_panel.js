// One selection: profile type, label matchers, time range and the
// timeline of its total. Compare mode shows two of these.

import { formatDateTime, profileTypeLabel, toDateTimeLocal } from './format.js';
import { MatcherInput } from './matcher_input.js';
import { PRESETS, completeMatchers, describeRange, joinSelector, resolveRange, splitSelector } from './query_state.js';
import { TimelineChart } from './timeline.js';

function element(tag, props = {}, children = []) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = value;
    else if (key in el) el[key] = value;
    else el.setAttribute(key, value);
  }
  for (const child of children) el.append(child);
  return el;
}

export class SelectionPanel {
  constructor({ root, name, color, api, onRun }) {
    this.root = root;
    this.name = name;
    this.api = api;
    this.onRun = onRun;
    this.types = [];
    this.from = 'now-1h';
    this.to = 'now';
    this.pendingType = '';
    this.nameCache = new Map();
    this.valueCache = new Map();

    this.badge = element('span', { class: 'badge', text: name, title: `Selection ${name}` });
    this.badge.style.background = color;
    this.typeSelect = element('select', { class: 'profile-type', 'aria-label': 'Profile type' });
    this.typeSelect.addEventListener('change', () => {
      this.clearCaches();
      this.onRun();
    });
    this.matcherField = element('input', {
      class: 'matchers',
      type: 'text',
      spellcheck: false,
      autocomplete: 'off',
      placeholder: 'pod="checkout-7d9f", namespace=~"shop.*"',
      'aria-label': 'Label matchers',
    });
    this.suggestions = element('ul', { class: 'suggestions', role: 'listbox', hidden: true });
    const matcherBox = element('div', { class: 'matcher-box' }, [
      element('span', { class: 'brace', text: '{' }),
      this.matcherField,
      element('span', { class: 'brace', text: '}' }),
      this.suggestions,
    ]);
    this.matchers = new MatcherInput({
      input: this.matcherField,
      list: this.suggestions,
      getNames: () => this.labelNames(),
      getValues: (label) => this.labelValues(label),
      onSubmit: () => this.onRun(),
    });

    this.presetButtons = PRESETS.map((preset) => {
      const button = element('button', { type: 'button', class: 'preset', text: preset.label });
      button.dataset.from = preset.from;
      button.addEventListener('click', () => {
        this.setRange(preset.from, 'now');
        this.onRun();
      });
      return button;
    });
    this.rangeLabel = element('button', { type: 'button', class: 'range-label', title: 'Set an absolute range' });
    this.fromInput = element('input', { type: 'datetime-local', step: 1, 'aria-label': 'From' });
    this.toInput = element('input', { type: 'datetime-local', step: 1, 'aria-label': 'To' });
    const apply = element('button', { type: 'button', class: 'primary', text: 'Apply' });
    this.absoluteForm = element('div', { class: 'absolute-range', hidden: true }, [
      element('label', {}, ['From ', this.fromInput]),
      element('label', {}, ['To ', this.toInput]),
      apply,
    ]);
    this.rangeLabel.addEventListener('click', () => this.toggleAbsolute());
    apply.addEventListener('click', () => {
      const from = Date.parse(this.fromInput.value);
      const to = Date.parse(this.toInput.value);
      if (Number.isFinite(from) && Number.isFinite(to)) {
        this.setRange(String(from), String(to));
        this.absoluteForm.hidden = true;
        this.onRun();
      }
    });
    const timePicker = element('div', { class: 'time-picker' }, [
      element('div', { class: 'segmented', role: 'group', 'aria-label': 'Time range presets' }, this.presetButtons),
      this.rangeLabel,
      this.absoluteForm,
    ]);
    this.runButton = element('button', { type: 'button', class: 'primary run', text: 'Run' });
    this.runButton.addEventListener('click', () => this.onRun());

    const canvas = element('canvas', { class: 'timeline' });
    const info = element('div', { class: 'timeline-info' });
    const chartBox = element('div', { class: 'timeline-box' }, [canvas]);
    this.timeline = new TimelineChart({
      container: chartBox,
      canvas,
      info,
      color,
      onBrush: (startMs, endMs) => {
        this.setRange(String(startMs), String(endMs));
        this.onRun();
      },
    });
    root.replaceChildren(
      element('div', { class: 'selection-row' }, [this.badge, this.typeSelect, matcherBox, timePicker, this.runButton]),
      chartBox,
      info,
    );
  }

  clearCaches() {
    this.nameCache.clear();
    this.valueCache.clear();
  }

  toggleAbsolute() {
    const now = Date.now();
    try {
      const { startMs, endMs } = resolveRange({ from: this.from, to: this.to }, now);
      this.fromInput.value = toDateTimeLocal(startMs);
      this.toInput.value = toDateTimeLocal(endMs);
    } catch {
      // Leave the inputs as they are.
    }
    this.absoluteForm.hidden = !this.absoluteForm.hidden;
  }

  setRange(from, to) {
    this.from = from;
    this.to = to;
    this.clearCaches();
    for (const button of this.presetButtons) {
      button.classList.toggle('active', to === 'now' && button.dataset.from === from);
    }
    this.rangeLabel.textContent = describeRange({ from, to }, formatDateTime);
  }

  setProfileTypes(types) {
    this.types = types;
    const wanted = this.pendingType || this.typeSelect.value;
    this.typeSelect.replaceChildren(
      ...types.map((id) => element('option', { value: id, text: profileTypeLabel(id), title: id })),
    );
    if (!types.length) {
      this.typeSelect.append(element('option', { value: '', text: 'No profiles in this range' }));
    }
    const match = types.find((t) => t === wanted) || types.find((t) => wanted && t.startsWith(`${wanted}:`));
    const preferred = types.find((t) => /cpu/.test(t)) || types[0] || '';
    this.typeSelect.value = match || preferred;
    if (!match && wanted && types.length) {
      // Keep an abbreviated or unknown type visible rather than silently replacing it.
      this.typeSelect.append(element('option', { value: wanted, text: wanted }));
      this.typeSelect.value = wanted;
    }
    this.pendingType = '';
  }

  // The selection as URL state: {query, from, to}.
  selection() {
    return { query: joinSelector(this.typeSelect.value || this.pendingType, this.matchers.value), from: this.from, to: this.to };
  }

  setSelection(selection) {
    const { profileType, matchers } = splitSelector(selection.query);
    this.pendingType = profileType;
    if ([...this.typeSelect.options].some((o) => o.value === profileType)) this.typeSelect.value = profileType;
    this.matchers.value = matchers;
    this.setRange(selection.from, selection.to);
  }

  range(nowMs) {
    return resolveRange({ from: this.from, to: this.to }, nowMs);
  }

  profileType() {
    return this.typeSelect.value || this.pendingType;
  }

  async labelNames() {
    const type = this.profileType();
    if (!this.nameCache.has(type)) {
      const names = this.api.labelNames(joinSelector(type, ''), this.range(Date.now()));
      names.catch(() => this.nameCache.delete(type));
      this.nameCache.set(type, names);
    }
    return this.nameCache.get(type);
  }

  // Values of `label` among the series the other complete matchers already
  // typed select, so a suggestion never leads to an empty selection.
  async labelValues(label) {
    const selector = joinSelector(this.profileType(), completeMatchers(this.matcherField.value, label));
    const key = `${selector}\n${label}`;
    if (!this.valueCache.has(key)) {
      const values = this.api.labelValues(label, selector, this.range(Date.now()));
      values.catch(() => this.valueCache.delete(key));
      this.valueCache.set(key, values);
    }
    return this.valueCache.get(key);
  }

  // Marks the matcher box after a selector error at 1-based `position` of
  // the full selector (`type{matchers}`), selecting the offending character;
  // null clears the mark.
  markSelectorError(position) {
    const box = this.matcherField.parentElement;
    if (position === null) {
      box.classList.remove('invalid');
      return;
    }
    box.classList.add('invalid');
    const offset = position - 1 - (this.profileType().length + 1);
    const text = this.matchers.value;
    if (offset >= 0 && offset <= text.length) {
      this.matcherField.focus();
      this.matcherField.setSelectionRange(offset, Math.min(offset + 1, text.length));
    }
  }

  setBusy(busy) {
    this.runButton.disabled = busy;
    this.root.classList.toggle('busy', busy);
  }
}
