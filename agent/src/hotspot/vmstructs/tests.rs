use super::*;
use crate::hotspot::test_memory::FakeMemory;

const SYMBOLS: u64 = 0x10_000;
const STRINGS: u64 = 0x20_000;
const STRUCTS: u64 = 0x30_000;
const TYPES: u64 = 0x40_000;
const INTS: u64 = 0x50_000;
const LONGS: u64 = 0x60_000;

/// Tables laid out as JDK 17 lays them out, in fake memory.
struct Tables {
    memory: FakeMemory,
    symbols: ExportedSymbols,
    next_string: u64,
}

impl Tables {
    fn new() -> Tables {
        let mut memory = FakeMemory::default();
        for base in [SYMBOLS, STRINGS, STRUCTS, TYPES, INTS, LONGS] {
            memory.map(base, vec![0; 0x8000]);
        }
        let mut symbols = ExportedSymbols::default();
        let names: [&[u8]; 20] = [
            b"gHotSpotVMStructs",
            b"gHotSpotVMStructEntryTypeNameOffset",
            b"gHotSpotVMStructEntryFieldNameOffset",
            b"gHotSpotVMStructEntryIsStaticOffset",
            b"gHotSpotVMStructEntryOffsetOffset",
            b"gHotSpotVMStructEntryAddressOffset",
            b"gHotSpotVMStructEntryArrayStride",
            b"gHotSpotVMTypes",
            b"gHotSpotVMTypeEntryTypeNameOffset",
            b"gHotSpotVMTypeEntrySizeOffset",
            b"gHotSpotVMTypeEntryArrayStride",
            b"gHotSpotVMIntConstants",
            b"gHotSpotVMIntConstantEntryNameOffset",
            b"gHotSpotVMIntConstantEntryValueOffset",
            b"gHotSpotVMIntConstantEntryArrayStride",
            b"gHotSpotVMLongConstants",
            b"gHotSpotVMLongConstantEntryNameOffset",
            b"gHotSpotVMLongConstantEntryValueOffset",
            b"gHotSpotVMLongConstantEntryArrayStride",
            b"gHotSpotVMStructEntryTypeStringOffset",
        ];
        for (i, name) in names.iter().enumerate() {
            assert!(symbols.set(name, SYMBOLS + 8 * i as u64));
        }
        assert_eq!(symbols.first_missing(), None);
        let values = [
            STRUCTS + 0x1000,
            0,
            8,
            24,
            32,
            40,
            48,
            TYPES + 0x1000,
            0,
            32,
            40,
            INTS + 0x1000,
            0,
            8,
            16,
            LONGS + 0x1000,
            0,
            8,
            16,
            16,
        ];
        for (i, value) in values.iter().enumerate() {
            memory.write_u64(SYMBOLS + 8 * i as u64, *value);
        }
        Tables {
            memory,
            symbols,
            next_string: STRINGS,
        }
    }

    fn string(&mut self, s: &str) -> u64 {
        let at = self.next_string;
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        self.memory.write(at, &bytes);
        self.next_string += bytes.len() as u64;
        at
    }

    fn field(&mut self, index: u64, type_name: &str, field: &str, place: FieldPlace) {
        self.typed_field(index, type_name, field, "int", place);
    }

    fn typed_field(
        &mut self,
        index: u64,
        type_name: &str,
        field: &str,
        type_string: &str,
        place: FieldPlace,
    ) {
        let entry = self.struct_array() + index * 48;
        let (t, f) = (self.string(type_name), self.string(field));
        let ts = self.string(type_string);
        self.memory.write_u64(entry, t);
        self.memory.write_u64(entry + 8, f);
        self.memory.write_u64(entry + 16, ts);
        match place {
            FieldPlace::Offset(offset) => self.memory.write_u64(entry + 32, offset),
            FieldPlace::Static(address) => {
                self.memory.write(entry + 24, &1u32.to_le_bytes());
                self.memory.write_u64(entry + 40, address);
            }
        }
    }

    fn type_size(&mut self, index: u64, type_name: &str, size: u64) {
        let entry = TYPES + 0x1000 + index * 40;
        let t = self.string(type_name);
        self.memory.write_u64(entry, t);
        self.memory.write_u64(entry + 32, size);
    }

    fn int_constant(&mut self, index: u64, name: &str, value: i32) {
        let entry = INTS + 0x1000 + index * 16;
        let n = self.string(name);
        self.memory.write_u64(entry, n);
        self.memory.write(entry + 8, &value.to_le_bytes());
    }

    fn struct_array(&self) -> u64 {
        STRUCTS + 0x1000
    }
}

fn jdk17_like() -> Tables {
    let mut tables = Tables::new();
    tables.field(0, "CodeBlob", "_frame_size", FieldPlace::Offset(28));
    tables.field(
        1,
        "CodeCache",
        "_heaps",
        FieldPlace::Static(0x7f00_0000_1000),
    );
    tables.field(2, "Unwanted", "_field", FieldPlace::Offset(8));
    tables.typed_field(
        3,
        "CodeBlob",
        "_name",
        "const char*",
        FieldPlace::Offset(96),
    );
    tables.typed_field(
        4,
        "CodeBlob",
        "_frame_complete_offset",
        "int16_t",
        FieldPlace::Offset(54),
    );
    tables.type_size(0, "CodeBlob", 104);
    tables.type_size(1, "HeapBlock::Header", 16);
    tables.int_constant(0, "frame::interpreter_frame_method_offset", -3);
    tables.int_constant(1, "Unwanted::constant", 1);
    tables
}

#[test]
fn fields_sizes_and_constants_are_read_by_name() {
    let tables = jdk17_like();
    let found = read(
        &tables.memory,
        &tables.symbols,
        &["CodeBlob", "CodeCache", "HeapBlock", "frame"],
    )
    .expect("tables read");
    assert_eq!(found.offset("CodeBlob", "_frame_size"), Ok(28));
    assert_eq!(found.offset("CodeBlob", "_name"), Ok(96));
    assert_eq!(found.address("CodeCache", "_heaps"), Ok(0x7f00_0000_1000));
    assert_eq!(found.size("CodeBlob"), Ok(104));
    assert_eq!(found.integer_field("CodeBlob", "_frame_size"), Ok((28, 4)));
    assert_eq!(
        found.integer_field("CodeBlob", "_frame_complete_offset"),
        Ok((54, 2))
    );
    assert!(
        found.integer_field("CodeBlob", "_name").is_err(),
        "a pointer"
    );
    assert_eq!(found.size("HeapBlock::Header"), Ok(16));
    assert_eq!(
        found.constant("frame::interpreter_frame_method_offset"),
        Ok(-3)
    );
    assert!(found.offset("Unwanted", "_field").is_err(), "not kept");
    assert!(found.constant("Unwanted::constant").is_err());
    assert_eq!(
        found.offset_of_any(&[("nmethod", "_method"), ("CodeBlob", "_name")]),
        Ok(96)
    );
    let error = found.offset("Method", "_constMethod").unwrap_err();
    assert_eq!(error.reason(), "vmstructs_missing_entry");
    assert!(error.to_string().contains("Method::_constMethod"));
}

#[test]
fn a_jvm_that_has_not_filled_its_tables_is_not_initialized() {
    let mut tables = jdk17_like();
    // The stride variables are zero until the VM fills them in.
    tables.memory.write_u64(SYMBOLS + 6 * 8, 0);
    let error = read(&tables.memory, &tables.symbols, &["CodeBlob"]).unwrap_err();
    assert_eq!(error.reason(), "vmstructs_not_initialized");
}

#[test]
fn forged_layouts_are_refused_with_a_reason() {
    // A member outside the entry.
    let mut tables = jdk17_like();
    tables.memory.write_u64(SYMBOLS + 4 * 8, 4096);
    let error = read(&tables.memory, &tables.symbols, &["CodeBlob"]).unwrap_err();
    assert!(matches!(error, VmStructsError::BadLayout { .. }), "{error}");
    assert_eq!(error.reason(), "vmstructs_invalid");
    // An absurd stride.
    let mut tables = jdk17_like();
    tables.memory.write_u64(SYMBOLS + 6 * 8, u64::MAX);
    let error = read(&tables.memory, &tables.symbols, &["CodeBlob"]).unwrap_err();
    assert!(matches!(error, VmStructsError::BadLayout { .. }), "{error}");
}

#[test]
fn a_table_without_its_terminator_costs_bounded_reads() {
    let mut tables = Tables::new();
    // Every entry of the mapped region names a type: the terminator is
    // never met before the region ends, so the read fails, bounded.
    let name = tables.string("CodeBlob");
    let array = tables.struct_array();
    let mut at = array;
    while at + 48 <= STRUCTS + 0x8000 {
        tables.memory.write_u64(at, name);
        tables.memory.write_u64(at + 8, name);
        at += 48;
    }
    let error = read(&tables.memory, &tables.symbols, &["CodeBlob"]).unwrap_err();
    assert_eq!(error.reason(), "vmstructs_unreadable", "{error}");
}

#[test]
fn unterminated_names_are_refused() {
    let mut tables = jdk17_like();
    let long = "x".repeat(MAX_NAME_BYTES + 10);
    let at = tables.string(&long);
    let entry = tables.struct_array();
    tables.memory.write_u64(entry, at);
    let error = read(&tables.memory, &tables.symbols, &["CodeBlob"]).unwrap_err();
    assert!(matches!(error, VmStructsError::BadName { .. }), "{error}");
}

#[test]
fn strings_are_read_across_pages() {
    let mut memory = FakeMemory::default();
    memory.map(0x1000, vec![b'a'; 0x3000]);
    memory.write(0x2ff0, b"bcdefghijklmnopqrstuvwxyz\0");
    let read = read_c_string(&memory, 0x2ff0, 64).expect("terminated");
    assert_eq!(read, "bcdefghijklmnopqrstuvwxyz");
    assert_eq!(read_c_string(&memory, 0x1000, 32), None, "over the cap");
    assert_eq!(read_c_string(&memory, 0x9000, 32), None, "unmapped");
}
