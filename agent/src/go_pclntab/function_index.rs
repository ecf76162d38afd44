//! A Go binary's functions by address, and each one's stack-pointer rules
//! read when first needed (pure; the bytes come through a
//! [`PclntabSource`]).

use super::{GoFunction, Pclntab, PclntabSource};

/// What [`GoFunctionRules::rule_at`] says of a pc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoFrameRule {
    /// The stack pointer is this many bytes below the one the function was
    /// entered with, where its return address lies.
    StackPointerBelowEntry(u32),
    /// The function is its stack's root: there is no caller.
    Root,
}

/// A Go binary's functions by address, from the function table alone (8
/// bytes a function: kube-apiserver's 138,620 take 1.1 MB); a function's
/// stack-pointer table is read only when a pc first lands in it
/// ([`GoFunctionIndex::rules`]), since most functions are never sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFunctionIndex {
    header: Pclntab,
    /// Stated address the starts count from.
    base: u64,
    /// (start from `base`, record offset from the function table), sorted.
    functions: Box<[(u32, u32)]>,
    /// Where the last function ends, from `base`.
    end: u32,
}

/// Where a pc's function is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFunctionAt {
    /// Its position in the table (the key of its rules).
    pub index: u32,
    /// Its entry and end (stated addresses).
    pub entry: u64,
    pub end: u64,
}

/// One function's rules: the steps of its stack-pointer table as (offset
/// from its entry, bytes below the entry stack pointer), or root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoFunctionRules {
    /// `runtime.goexit` and the other roots.
    Root,
    /// Steps in order; none where its table was missing or malformed.
    Steps(Box<[(u32, u32)]>),
}

impl GoFunctionRules {
    /// The rule at `offset` bytes into the function.
    pub fn rule_at(&self, offset: u64) -> Option<GoFrameRule> {
        match self {
            GoFunctionRules::Root => Some(GoFrameRule::Root),
            GoFunctionRules::Steps(steps) => {
                let offset = u32::try_from(offset).ok()?;
                let after = steps.partition_point(|&(start, _)| start <= offset);
                let (_, below) = steps[after.checked_sub(1)?];
                Some(GoFrameRule::StackPointerBelowEntry(below))
            }
        }
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> u64 {
        match self {
            GoFunctionRules::Root => 0,
            GoFunctionRules::Steps(steps) => (steps.len() * size_of::<(u32, u32)>()) as u64,
        }
    }
}

impl GoFunctionIndex {
    /// Reads the function table of `pclntab` (entries only, in order),
    /// starts counted from `base` (the binary's lowest load address);
    /// `None` when it is empty, unsorted or out of reach of 32-bit offsets.
    pub fn build(
        pclntab: &Pclntab,
        source: &mut impl PclntabSource,
        base: u64,
    ) -> Option<GoFunctionIndex> {
        let relative = |address: u64| u32::try_from(address.checked_sub(base)?).ok();
        let mut functions: Vec<(u32, u32)> =
            Vec::with_capacity(pclntab.function_count().min(1 << 16));
        for index in 0..pclntab.function_count() {
            let (entry, record) = pclntab.entry(source, index)?;
            let start = relative(entry)?;
            // Overlapping or unsorted functions would break the search.
            if functions.last().is_some_and(|&(last, _)| last >= start) {
                return None;
            }
            functions.push((start, u32::try_from(record).ok()?));
        }
        let (end, _) = pclntab.entry(source, pclntab.function_count())?;
        let end = relative(end)?;
        if functions.last().is_none_or(|&(last, _)| last >= end) {
            return None;
        }
        Some(GoFunctionIndex {
            header: pclntab.clone(),
            base,
            functions: functions.into_boxed_slice(),
            end,
        })
    }

    /// The function holding stated address `pc`.
    pub fn function_at(&self, pc: u64) -> Option<GoFunctionAt> {
        let relative = u32::try_from(pc.checked_sub(self.base)?).ok()?;
        if relative >= self.end {
            return None;
        }
        let after = self
            .functions
            .partition_point(|&(start, _)| start <= relative);
        let index = after.checked_sub(1)?;
        let (start, _) = self.functions[index];
        let end = self
            .functions
            .get(after)
            .map_or(self.end, |&(next, _)| next);
        Some(GoFunctionAt {
            index: u32::try_from(index).ok()?,
            entry: self.base + u64::from(start),
            end: self.base + u64::from(end),
        })
    }

    /// The rules of the function `at`, read from `source` (its record and
    /// its stack-pointer table: a few dozen bytes).
    pub fn rules(&self, source: &mut impl PclntabSource, at: &GoFunctionAt) -> GoFunctionRules {
        let no_rules = GoFunctionRules::Steps(Box::default());
        let Some(&(_, record)) = self.functions.get(at.index as usize) else {
            return no_rules;
        };
        let Some((_, pcsp, top_frame)) = self.header.record_fields(source, record as usize) else {
            return no_rules;
        };
        if top_frame {
            return GoFunctionRules::Root;
        }
        let function = GoFunction {
            entry: at.entry,
            end: at.end,
            name: 0,
            pcsp,
            top_frame,
        };
        let steps = self
            .header
            .sp_steps(source, &function)
            .into_iter()
            // A negative offset is no frame Go writes: the table ends there.
            .map_while(|(range, sp)| {
                Some((
                    u32::try_from(range.start - at.entry).ok()?,
                    u32::try_from(sp).ok()?,
                ))
            })
            .collect();
        GoFunctionRules::Steps(steps)
    }

    /// Bytes the index holds.
    pub fn held_bytes(&self) -> u64 {
        (self.functions.len() * size_of::<(u32, u32)>()) as u64
    }
}
