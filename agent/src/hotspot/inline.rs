//! Methods inlined into a compiled method: HotSpot records, at each call
//! return address and safepoint of an nmethod, a `PcDesc` whose scope
//! (`ScopeDesc`) names the method and bytecode index being run there, and
//! the scope it was inlined into, out to the nmethod's own method. The
//! scopes are a compressed stream (UNSIGNED5 numbers); methods are indexes
//! into the nmethod's metadata section.
//!
//! JDK 8-22 find those sections from the nmethod's header; JDK 23 and
//! later keep PcDescs and scopes in the nmethod's immutable data and its
//! metadata after the relocations in its mutable data. A guess that reads
//! the wrong place is caught: the outermost scope must be the nmethod's own
//! method, or the nmethod's method is named alone.

use super::layout::IntegerField;
use super::vmstructs::{RemoteMemory, VmStructs, read_u32, read_u64};

/// Scopes in one chain at most (HotSpot's inlining depth is 15 by default).
const MAX_SCOPE_DEPTH: usize = 64;
/// Bytes of PcDescs read per nmethod at most (16 bytes each).
const MAX_PC_DESC_BYTES: u64 = 1 << 20;
/// Bytes read per scope: its header (sender, method, bci) is 15 at most.
const SCOPE_HEADER_BYTES: usize = 16;

/// Where an nmethod keeps its PcDescs, scopes and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineLayout {
    pub sections: Sections,
    pub pc_desc_size: u64,
    pub pc_desc_pc_offset: u64,
    pub pc_desc_scope_offset: u64,
}

impl InlineLayout {
    /// The layout, when the tables describe an nmethod whose sections are
    /// found from its header (JDK 8-22).
    pub fn from_vmstructs(tables: &VmStructs) -> Option<InlineLayout> {
        let int = |t: &str, f: &str| -> Option<u64> {
            let (offset, width): IntegerField = tables.integer_field(t, f).ok()?;
            (width == 4).then_some(offset)
        };
        let header = || -> Option<Sections> {
            Some(Sections::Header {
                pcs_offset: int("nmethod", "_scopes_pcs_offset")?,
                pcs_end_offset: int("nmethod", "_dependencies_offset")?,
                metadata_offset: int("nmethod", "_metadata_offset")?,
                scopes_data_begin: tables
                    .offset_of_any(&[
                        ("CompiledMethod", "_scopes_data_begin"),
                        ("nmethod", "_scopes_data_begin"),
                    ])
                    .ok()?,
            })
        };
        let data = || -> Option<Sections> {
            Some(Sections::Data {
                immutable_data: tables.offset("nmethod", "_immutable_data").ok()?,
                pcs_offset: int("nmethod", "_scopes_pcs_offset")?,
                scopes_data_offset: int("nmethod", "_scopes_data_offset")?,
                mutable_data: tables.offset("CodeBlob", "_mutable_data").ok()?,
                mutable_data_size: int("CodeBlob", "_mutable_data_size")?,
                relocation_size: int("CodeBlob", "_relocation_size")?,
            })
        };
        Some(InlineLayout {
            sections: header().or_else(data)?,
            pc_desc_size: tables.size("PcDesc").ok().filter(|&s| s >= 8)?,
            pc_desc_pc_offset: int("PcDesc", "_pc_offset")?,
            pc_desc_scope_offset: int("PcDesc", "_scope_decode_offset")?,
        })
    }
}

/// Where an nmethod's sections are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sections {
    /// JDK 8-22, from the nmethod's header: offsets of its PcDescs, of
    /// their end and of its metadata; the field holding the address of its
    /// scopes data (where metadata ends).
    Header {
        pcs_offset: u64,
        pcs_end_offset: u64,
        metadata_offset: u64,
        scopes_data_begin: u64,
    },
    /// JDK 23 and later: fields holding the immutable data's address (and
    /// offsets of PcDescs and scopes in it) and the mutable data's address
    /// and size (and the relocations' size, which metadata follows).
    Data {
        immutable_data: u64,
        pcs_offset: u64,
        scopes_data_offset: u64,
        mutable_data: u64,
        mutable_data_size: u64,
        relocation_size: u64,
    },
}

/// One nmethod's PcDescs and sections, read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NmethodScopes {
    /// (pc offset from the code's start, scope decode offset), sorted.
    pcs: Vec<(u32, u32)>,
    scopes_data: u64,
    metadata: u64,
    metadata_count: u64,
}

impl NmethodScopes {
    /// PcDescs held.
    pub fn len(&self) -> usize {
        self.pcs.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.pcs.is_empty()
    }
}

/// Reads the PcDescs of the nmethod at `blob`.
pub fn read_scopes(
    memory: &dyn RemoteMemory,
    layout: &InlineLayout,
    blob: u64,
) -> Option<NmethodScopes> {
    let int = |offset: u64| {
        read_u32(memory, blob.wrapping_add(offset))
            .ok()
            .map(u64::from)
    };
    let (pcs_begin, pcs_end, scopes_data, metadata, metadata_end) = match layout.sections {
        Sections::Header {
            pcs_offset,
            pcs_end_offset,
            metadata_offset,
            scopes_data_begin,
        } => {
            let scopes_data = read_u64(memory, blob.wrapping_add(scopes_data_begin)).ok()?;
            (
                blob.wrapping_add(int(pcs_offset)?),
                blob.wrapping_add(int(pcs_end_offset)?),
                scopes_data,
                blob.wrapping_add(int(metadata_offset)?),
                scopes_data,
            )
        }
        Sections::Data {
            immutable_data,
            pcs_offset,
            scopes_data_offset,
            mutable_data,
            mutable_data_size,
            relocation_size,
        } => {
            let immutable = read_u64(memory, blob.wrapping_add(immutable_data)).ok()?;
            let mutable = read_u64(memory, blob.wrapping_add(mutable_data)).ok()?;
            let scopes_data = immutable.checked_add(int(scopes_data_offset)?)?;
            (
                immutable.checked_add(int(pcs_offset)?)?,
                scopes_data,
                scopes_data,
                mutable.checked_add(int(relocation_size)?)?,
                mutable.checked_add(int(mutable_data_size)?)?,
            )
        }
    };
    let bytes = pcs_end.checked_sub(pcs_begin)?;
    if bytes > MAX_PC_DESC_BYTES || metadata > metadata_end {
        return None;
    }
    let mut raw = vec![0u8; usize::try_from(bytes).ok()?];
    memory.read(pcs_begin, &mut raw).ok()?;
    let size = usize::try_from(layout.pc_desc_size).ok()?;
    let field = |desc: &[u8], offset: u64| -> Option<u32> {
        let at = usize::try_from(offset).ok()?;
        Some(u32::from_le_bytes(desc.get(at..at + 4)?.try_into().ok()?))
    };
    let mut pcs = Vec::with_capacity(raw.len() / size);
    for desc in raw.chunks_exact(size) {
        pcs.push((
            field(desc, layout.pc_desc_pc_offset)?,
            field(desc, layout.pc_desc_scope_offset)?,
        ));
    }
    pcs.sort_unstable();
    Some(NmethodScopes {
        pcs,
        scopes_data,
        metadata,
        metadata_count: (metadata_end - metadata) / 8,
    })
}

/// The methods run at `pc_offset` (from the code's start; for a caller, a
/// byte inside its call), innermost first, each with its bytecode index
/// (`None` when unknown). Empty when nothing is recorded there.
pub fn scopes_at(
    memory: &dyn RemoteMemory,
    scopes: &NmethodScopes,
    pc_offset: u64,
    excluded: u8,
) -> Vec<(u64, Option<u32>)> {
    // PcDescs sit at return addresses: the first one past a pc is where
    // the call (or the instructions before the next safepoint) returns.
    let at = scopes
        .pcs
        .partition_point(|&(pc, _)| u64::from(pc) <= pc_offset);
    let Some(&(_, mut decode)) = scopes.pcs.get(at) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    // 0 is HotSpot's "no scope" (serialized null); the 0 byte that ends a
    // chain in the older encoding is out of range in the newer one.
    while decode != 0 && found.len() < MAX_SCOPE_DEPTH {
        let mut header = [0u8; SCOPE_HEADER_BYTES];
        let address = scopes.scopes_data.wrapping_add(u64::from(decode));
        // The last scope may end near the section's end: read less then.
        let read = [SCOPE_HEADER_BYTES, 8, 4]
            .into_iter()
            .find(|&len| memory.read(address, &mut header[..len]).is_ok());
        let Some(len) = read else { break };
        let mut reader = super::names::Unsigned5 {
            bytes: &header[..len],
            at: 0,
            excluded,
        };
        let (Some(sender), Some(index), Some(bci)) =
            (reader.unsigned(), reader.unsigned(), reader.unsigned())
        else {
            break;
        };
        let index = u64::from(index);
        if index == 0 || index > scopes.metadata_count {
            break;
        }
        let Ok(method) = read_u64(memory, scopes.metadata.wrapping_add((index - 1) * 8)) else {
            break;
        };
        // Stored plus one: -1 is "method entry".
        found.push((method, bci.checked_sub(1)));
        if sender >= decode {
            // Senders are written before the scopes inlined into them.
            break;
        }
        decode = sender;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hotspot::test_memory::FakeMemory;

    #[test]
    fn a_pc_names_its_inlined_methods_innermost_first() {
        let mut memory = FakeMemory::default();
        // Metadata: two methods; scopes data after it.
        let metadata = 0x1000;
        memory.map(metadata, vec![0; 0x100]);
        memory.write_u64(metadata, 0xAAA0);
        memory.write_u64(metadata + 8, 0xBBB0);
        let scopes_data = metadata + 16;
        // At 1: the outer scope (no sender, method 1, bci 7 -> stored 8);
        // at 5: the inner one (sender 1, method 2, bci 3 -> stored 4).
        memory.write(scopes_data + 1, &[0, 1, 8]);
        memory.write(scopes_data + 5, &[1, 2, 4]);
        let scopes = NmethodScopes {
            pcs: vec![(0x10, 1), (0x40, 5)],
            scopes_data,
            metadata,
            metadata_count: 2,
        };
        assert_eq!(
            scopes_at(&memory, &scopes, 0x20, 0),
            vec![(0xBBB0, Some(3)), (0xAAA0, Some(7))]
        );
        assert_eq!(
            scopes_at(&memory, &scopes, 0x05, 0),
            vec![(0xAAA0, Some(7))]
        );
        assert_eq!(
            scopes_at(&memory, &scopes, 0x40, 0),
            vec![],
            "past the last"
        );
        // JDK 21's encoding: every byte one more, so none is 0.
        memory.write(scopes_data + 1, &[1, 2, 9]);
        memory.write(scopes_data + 5, &[2, 3, 5]);
        assert_eq!(
            scopes_at(&memory, &scopes, 0x20, 1),
            vec![(0xBBB0, Some(3)), (0xAAA0, Some(7))]
        );
    }

    #[test]
    fn forged_scopes_end_the_chain() {
        let mut memory = FakeMemory::default();
        memory.map(0x1000, vec![0; 0x100]);
        memory.write_u64(0x1000, 0xAAA0);
        // A scope whose sender is itself, and one with a method index past
        // the metadata.
        memory.write(0x1010 + 3, &[3, 1, 1]);
        memory.write(0x1010 + 9, &[0, 9, 1]);
        let scopes = NmethodScopes {
            pcs: vec![(0x10, 3), (0x20, 9)],
            scopes_data: 0x1010,
            metadata: 0x1000,
            metadata_count: 1,
        };
        assert_eq!(scopes_at(&memory, &scopes, 0, 0), vec![(0xAAA0, Some(0))]);
        assert_eq!(scopes_at(&memory, &scopes, 0x10, 0), vec![]);
    }
}
