// The label matcher input (`pod="a", namespace=~"shop.*"`), with
// autocomplete of label names and values fetched from the store.

const NAME_CHAR = /[A-Za-z0-9_.]/;
const MAX_SUGGESTIONS = 50;

// Where the cursor is in the matcher grammar, and so what to suggest:
// {kind: 'name', prefix, start, end} while typing a label name,
// {kind: 'value', label, prefix, start, end, quote} inside a value
// (quote is '' when no quote has been typed yet), or null.
export function completionContext(text, cursor) {
  let state = 'name-start';
  let nameStart = 0;
  let label = '';
  let valueStart = 0;
  let quote = '';
  for (let i = 0; i < cursor; i += 1) {
    const ch = text[i];
    switch (state) {
      case 'name-start':
        if (NAME_CHAR.test(ch)) {
          state = 'name';
          nameStart = i;
        } else if (ch !== ' ' && ch !== ',' && ch !== '\t') state = 'invalid';
        break;
      case 'name':
        if (!NAME_CHAR.test(ch)) {
          label = text.slice(nameStart, i);
          state = ch === ' ' ? 'after-name' : '=!~'.includes(ch) ? 'op' : 'invalid';
        }
        break;
      case 'after-name':
        if ('=!~'.includes(ch)) state = 'op';
        else if (ch !== ' ') state = 'invalid';
        break;
      case 'op':
        if (ch === '"' || ch === "'" || ch === '`') {
          state = 'value';
          quote = ch;
          valueStart = i + 1;
        } else if (!'=!~ '.includes(ch)) state = 'invalid';
        break;
      case 'value':
        if (ch === '\\' && quote !== '`') i += 1;
        else if (ch === quote) state = 'after-value';
        break;
      case 'after-value':
        if (ch === ',') state = 'name-start';
        else if (ch !== ' ') state = 'invalid';
        break;
      default:
        return null;
    }
  }
  if (state === 'name-start') return { kind: 'name', prefix: '', start: cursor, end: cursor };
  if (state === 'name') {
    let end = cursor;
    while (end < text.length && NAME_CHAR.test(text[end])) end += 1;
    return { kind: 'name', prefix: text.slice(nameStart, cursor), start: nameStart, end };
  }
  if (state === 'op') return { kind: 'value', label, prefix: '', start: cursor, end: cursor, quote: '' };
  if (state === 'value') {
    let end = cursor;
    while (end < text.length && text[end] !== quote) end += text[end] === '\\' && quote !== '`' ? 2 : 1;
    return { kind: 'value', label, prefix: text.slice(valueStart, cursor), start: valueStart, end: Math.min(end, text.length), quote };
  }
  return null;
}

function escapeValue(value, quote) {
  if (quote === '`') return value;
  return value.replace(/\\/g, '\\\\').replace(new RegExp(quote, 'g'), `\\${quote}`);
}

// Applies a chosen suggestion; returns {text, cursor}.
export function applyCompletion(text, context, choice) {
  const before = text.slice(0, context.start);
  const after = text.slice(context.end);
  if (context.kind === 'name') {
    if (/^\s*[=!~]/.test(after)) return { text: before + choice + after, cursor: before.length + choice.length };
    const inserted = `${choice}=""`;
    return { text: before + inserted + after, cursor: before.length + inserted.length - 1 };
  }
  const quote = context.quote || '"';
  const value = escapeValue(choice, quote);
  if (!context.quote) {
    const inserted = `${quote}${value}${quote}`;
    return { text: before + inserted + after, cursor: before.length + inserted.length };
  }
  const closed = after.startsWith(quote);
  const rest = closed ? after.slice(1) : after;
  return { text: `${before}${value}${quote}${rest}`, cursor: before.length + value.length + 1 };
}

// Ranks suggestions: prefix matches first, then substring matches.
export function rankSuggestions(candidates, prefix) {
  const p = prefix.toLowerCase();
  const starts = [];
  const contains = [];
  for (const c of candidates) {
    const l = c.toLowerCase();
    if (l.startsWith(p)) starts.push(c);
    else if (p && l.includes(p)) contains.push(c);
  }
  return [...starts, ...contains].slice(0, MAX_SUGGESTIONS);
}

export class MatcherInput {
  constructor({ input, list, getNames, getValues, onSubmit }) {
    this.input = input;
    this.list = list;
    this.getNames = getNames;
    this.getValues = getValues;
    this.onSubmit = onSubmit || (() => {});
    this.items = [];
    this.active = -1;
    this.context = null;
    this.request = 0;
    input.addEventListener('input', () => this.refresh());
    input.addEventListener('focus', () => this.refresh());
    input.addEventListener('click', () => this.refresh());
    input.addEventListener('keydown', (e) => this.onKey(e));
    input.addEventListener('blur', () => setTimeout(() => this.close(), 150));
  }

  get value() {
    return this.input.value;
  }

  set value(text) {
    this.input.value = text;
  }

  async refresh() {
    const context = completionContext(this.input.value, this.input.selectionStart ?? this.input.value.length);
    this.context = context;
    const request = (this.request += 1);
    if (!context) return this.close();
    let candidates;
    try {
      candidates = context.kind === 'name' ? await this.getNames() : await this.getValues(context.label);
    } catch {
      candidates = [];
    }
    if (request !== this.request) return undefined;
    // Hide internal labels unless asked for.
    const visible = context.prefix.startsWith('__') ? candidates : candidates.filter((c) => !c.startsWith('__'));
    this.show(rankSuggestions(visible, context.prefix));
    return undefined;
  }

  show(items) {
    this.items = items;
    this.active = items.length ? 0 : -1;
    if (!items.length || document.activeElement !== this.input) return this.close();
    this.list.replaceChildren(
      ...items.map((item, i) => {
        const li = document.createElement('li');
        li.textContent = item;
        li.setAttribute('role', 'option');
        li.addEventListener('mousedown', (e) => {
          e.preventDefault();
          this.accept(i);
        });
        return li;
      }),
    );
    this.list.hidden = false;
    this.paintActive();
    return undefined;
  }

  close() {
    this.list.hidden = true;
    this.items = [];
    this.active = -1;
  }

  paintActive() {
    [...this.list.children].forEach((li, i) => {
      li.classList.toggle('active', i === this.active);
      if (i === this.active) li.scrollIntoView({ block: 'nearest' });
    });
  }

  accept(index) {
    const choice = this.items[index];
    if (choice === undefined || !this.context) return;
    const { text, cursor } = applyCompletion(this.input.value, this.context, choice);
    this.input.value = text;
    this.input.setSelectionRange(cursor, cursor);
    this.close();
    this.refresh();
  }

  onKey(event) {
    const open = !this.list.hidden && this.items.length > 0;
    if (event.key === 'ArrowDown' && open) {
      this.active = (this.active + 1) % this.items.length;
      this.paintActive();
      event.preventDefault();
    } else if (event.key === 'ArrowUp' && open) {
      this.active = (this.active - 1 + this.items.length) % this.items.length;
      this.paintActive();
      event.preventDefault();
    } else if ((event.key === 'Tab' || event.key === 'Enter') && open && this.active >= 0) {
      this.accept(this.active);
      event.preventDefault();
    } else if (event.key === 'Escape' && open) {
      this.close();
      event.preventDefault();
    } else if (event.key === 'Enter') {
      this.close();
      this.onSubmit();
      event.preventDefault();
    }
  }
}
