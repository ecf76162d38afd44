//! Where a `.gopclntab`'s bytes come from (pure): the section in memory,
//! or a file's section read a window at a time through a caller's `pread`.

/// The bytes of a `.gopclntab`: the whole section in memory, or a file's
/// section read a window at a time ([`WindowedSection`]). A large Go
/// binary's table is tens of MB (kube-apiserver's: 62 MB), and most of it
/// is line tables this module never reads.
pub trait PclntabSource {
    /// The section's length.
    fn section_len(&self) -> usize;
    /// `len` bytes at `offset`: `None` past the end or when reading fails.
    /// `len` is at most [`MAX_READ`].
    fn bytes(&mut self, offset: usize, len: usize) -> Option<&[u8]>;
}

/// The most bytes [`PclntabSource::bytes`] is asked for at once.
pub const MAX_READ: usize = 64;

impl PclntabSource for &[u8] {
    fn section_len(&self) -> usize {
        self.len()
    }

    fn bytes(&mut self, offset: usize, len: usize) -> Option<&[u8]> {
        self.get(offset..offset.checked_add(len)?)
    }
}

/// Bytes per window, and windows kept: the function table and records are
/// read in order, the pc tables mostly in order with a few shared tables
/// read again and again.
const WINDOW_BYTES: usize = 64 * 1024;
const WINDOWS: usize = 4;

/// A file's section read through `read_at(file offset, buffer)` a window
/// at a time, the least recently used window replaced: 256 KiB at most,
/// whatever the section's size.
pub struct WindowedSection<R: FnMut(u64, &mut [u8]) -> bool> {
    read_at: R,
    section_offset: u64,
    section_len: usize,
    window_bytes: usize,
    /// (start in the section, bytes, last use)
    windows: Vec<(usize, Vec<u8>, u64)>,
    clock: u64,
    reads: u64,
}

impl<R: FnMut(u64, &mut [u8]) -> bool> std::fmt::Debug for WindowedSection<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedSection")
            .field("section_offset", &self.section_offset)
            .field("section_len", &self.section_len)
            .field("windows", &self.windows.len())
            .field("reads", &self.reads)
            .finish_non_exhaustive()
    }
}

impl<R: FnMut(u64, &mut [u8]) -> bool> WindowedSection<R> {
    /// The section at `section_offset` of `section_len` bytes, read
    /// 64 KiB at a time (to read it through).
    pub fn new(read_at: R, section_offset: u64, section_len: usize) -> Self {
        Self::with_window(read_at, section_offset, section_len, WINDOW_BYTES)
    }

    /// The same, read `window_bytes` at a time (at least [`MAX_READ`]; to
    /// look up one function: a record and a table, a few dozen bytes each).
    pub fn with_window(
        read_at: R,
        section_offset: u64,
        section_len: usize,
        window_bytes: usize,
    ) -> Self {
        WindowedSection {
            read_at,
            section_offset,
            section_len,
            window_bytes: window_bytes.max(MAX_READ),
            windows: Vec::with_capacity(WINDOWS),
            clock: 0,
            reads: 0,
        }
    }

    /// Windows read so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }
}

impl<R: FnMut(u64, &mut [u8]) -> bool> PclntabSource for WindowedSection<R> {
    fn section_len(&self) -> usize {
        self.section_len
    }

    fn bytes(&mut self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.section_len || len > MAX_READ {
            return None;
        }
        self.clock += 1;
        let clock = self.clock;
        let found = self
            .windows
            .iter()
            .position(|(start, bytes, _)| *start <= offset && end <= start + bytes.len());
        let index = match found {
            Some(index) => index,
            None => {
                // From the page holding `offset`, so that a read just behind
                // the last one still falls in the window.
                let mut start = offset - offset % self.window_bytes.min(4096);
                if end > start + self.window_bytes {
                    start = offset;
                }
                let size = self.window_bytes.min(self.section_len - start);
                let mut bytes = vec![0; size];
                let at = self.section_offset.checked_add(start as u64)?;
                if !(self.read_at)(at, &mut bytes) {
                    return None;
                }
                self.reads += 1;
                if self.windows.len() < WINDOWS {
                    self.windows.push((start, bytes, clock));
                    self.windows.len() - 1
                } else {
                    let oldest = self
                        .windows
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, (_, _, used))| *used)
                        .map_or(0, |(index, _)| index);
                    self.windows[oldest] = (start, bytes, clock);
                    oldest
                }
            }
        };
        let (start, bytes, used) = &mut self.windows[index];
        *used = clock;
        bytes.get(offset - *start..end - *start)
    }
}

pub(super) fn u8_at(source: &mut impl PclntabSource, at: usize) -> Option<u8> {
    Some(source.bytes(at, 1)?[0])
}

pub(super) fn u32_at(source: &mut impl PclntabSource, at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(source.bytes(at, 4)?.try_into().ok()?))
}

pub(super) fn u64_at(source: &mut impl PclntabSource, at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(source.bytes(at, 8)?.try_into().ok()?))
}
