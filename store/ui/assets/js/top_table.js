// The sortable top-functions table: flat and cumulative per function in
// single mode, base versus compared share in compare mode.

import { formatPercent, formatSource, formatValue } from './format.js';

const MAX_ROWS = 1000;

const SINGLE_COLUMNS = [
  { key: 'name', label: 'Function', numeric: false },
  { key: 'flat', label: 'Flat', numeric: true },
  { key: 'flatShare', label: 'Flat%', numeric: true, narrow: true },
  { key: 'cumulative', label: 'Cum.', numeric: true },
  { key: 'cumulativeShare', label: 'Cum%', numeric: true, narrow: true },
];

const DIFF_COLUMNS = [
  { key: 'name', label: 'Function', numeric: false },
  { key: 'baseShare', label: 'A self', numeric: true },
  { key: 'compareShare', label: 'B self', numeric: true },
  { key: 'delta', label: 'Change', numeric: true },
];

export class TopTable {
  // `onSandwich(name)`, when given, gets a button per function row.
  constructor({ table, summary, onSelect, onSandwich }) {
    this.table = table;
    this.summary = summary;
    this.onSelect = onSelect || (() => {});
    this.onSandwich = onSandwich || null;
    this.rows = [];
    this.columns = SINGLE_COLUMNS;
    this.sortKey = 'flat';
    this.descending = true;
    this.unit = '';
    this.total = 0;
    this.highlight = null;
  }

  // `entries` are kiln-engine TopEntry values ({name, flat, cumulative,
  // source}); the source (`file:line`) is shown after the name.
  setTop(entries, total, unit) {
    this.columns = SINGLE_COLUMNS;
    this.unit = unit || '';
    this.total = total;
    this.rows = entries.map((e) => ({
      name: e.name,
      source: formatSource(e.source),
      flat: Number(e.flat) || 0,
      cumulative: Number(e.cumulative) || 0,
      flatShare: total ? (Number(e.flat) || 0) / total : 0,
      cumulativeShare: total ? (Number(e.cumulative) || 0) / total : 0,
    }));
    if (!SINGLE_COLUMNS.some((c) => c.key === this.sortKey)) this.sortKey = 'flat';
    this.render();
  }

  // `rows` from flame_layout.diffTableRows.
  setDiff(rows) {
    this.columns = DIFF_COLUMNS;
    this.rows = rows;
    if (!DIFF_COLUMNS.some((c) => c.key === this.sortKey)) {
      this.sortKey = 'delta';
      this.descending = true;
    }
    this.render();
  }

  clear() {
    this.rows = [];
    this.render();
  }

  setHighlight(test) {
    this.highlight = test;
    this.render();
  }

  sortBy(key) {
    if (this.sortKey === key) this.descending = !this.descending;
    else {
      this.sortKey = key;
      this.descending = key !== 'name';
    }
    this.render();
  }

  sortedRows() {
    const key = this.sortKey;
    const sign = this.descending ? -1 : 1;
    const column = this.columns.find((c) => c.key === key);
    const rows = [...this.rows];
    if (column && column.numeric) {
      // Change sorts by magnitude so the biggest movers come first.
      const value = key === 'delta' ? (r) => Math.abs(r.delta) : (r) => r[key];
      rows.sort((a, b) => sign * (value(a) - value(b)) || a.name.localeCompare(b.name));
    } else {
      rows.sort((a, b) => sign * a.name.localeCompare(b.name));
    }
    return rows;
  }

  cellText(row, key) {
    switch (key) {
      case 'flat':
      case 'cumulative':
        return formatValue(row[key], this.unit);
      case 'flatShare':
      case 'cumulativeShare':
      case 'baseShare':
      case 'compareShare':
        return formatPercent(row[key], 1);
      case 'delta': {
        const points = 100 * row.delta;
        return `${points >= 0 ? '+' : ''}${points.toFixed(2)} pp`;
      }
      default:
        return row[key];
    }
  }

  render() {
    const head = document.createElement('thead');
    const headRow = head.insertRow();
    for (const column of this.columns) {
      const th = document.createElement('th');
      th.textContent = column.label;
      th.className = column.numeric ? `num sortable${column.narrow ? ' narrow' : ''}` : 'sortable';
      th.dataset.key = column.key;
      if (column.key === this.sortKey) {
        th.classList.add('sorted');
        th.setAttribute('aria-sort', this.descending ? 'descending' : 'ascending');
        th.textContent += this.descending ? ' ▼' : ' ▲';
      }
      th.addEventListener('click', () => this.sortBy(column.key));
      headRow.appendChild(th);
    }
    const body = document.createElement('tbody');
    const rows = this.sortedRows();
    for (const row of rows.slice(0, MAX_ROWS)) {
      const tr = body.insertRow();
      tr.title = row.name;
      if (this.highlight && this.highlight(row.name)) tr.classList.add('match');
      for (const column of this.columns) {
        const td = tr.insertCell();
        td.textContent = this.cellText(row, column.key);
        if (column.numeric) td.className = 'num';
        else td.className = 'fn';
        if (column.key === 'name' && row.source) {
          const where = document.createElement('span');
          where.className = 'source';
          where.textContent = row.source;
          td.append(' ', where);
        }
        if (column.key === 'name' && this.onSandwich && this.columns === SINGLE_COLUMNS) {
          const open = document.createElement('button');
          open.type = 'button';
          open.className = 'sandwich-open';
          open.textContent = '⇅';
          open.title = 'Callers and callees (sandwich view)';
          open.setAttribute('aria-label', `Callers and callees of ${row.name}`);
          open.addEventListener('click', (event) => {
            event.stopPropagation();
            this.onSandwich(row.name);
          });
          td.prepend(open);
        }
        if (column.key === 'delta' && row.delta !== 0) td.classList.add(row.delta > 0 ? 'gain' : 'loss');
      }
      tr.addEventListener('click', () => this.onSelect(row.name));
    }
    this.table.replaceChildren(head, body);
    if (this.summary) {
      this.summary.textContent = rows.length > MAX_ROWS ? `${MAX_ROWS} of ${rows.length}` : `${rows.length}`;
    }
  }
}
