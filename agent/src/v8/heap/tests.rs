use std::cell::Cell;
use std::collections::HashMap;

use super::*;
use crate::v8::layout::tests::node20_constants;

/// A process's memory as sparse bytes, counting reads.
#[derive(Debug, Default)]
struct FakeMemory {
    bytes: HashMap<u64, u8>,
    reads: Cell<u64>,
}

impl FakeMemory {
    fn put(&mut self, address: u64, bytes: &[u8]) {
        for (i, &b) in bytes.iter().enumerate() {
            self.bytes.insert(address + i as u64, b);
        }
    }
    fn word(&mut self, address: u64, value: u64) {
        self.put(address, &value.to_le_bytes());
    }
    /// A map at `address` of objects of `instance_type`.
    fn map(&mut self, address: u64, instance_type: u16) {
        self.word(address, META | 1);
        self.put(address + 12, &instance_type.to_le_bytes());
    }
    fn one_byte(&mut self, address: u64, text: &str) {
        self.word(address, ONE_BYTE_MAP | 1);
        self.put(address + 12, &(text.len() as i32).to_le_bytes());
        self.put(address + 16, text.as_bytes());
    }
}

impl Memory for FakeMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        self.reads.set(self.reads.get() + 1);
        for (i, out) in buffer.iter_mut().enumerate() {
            match self.bytes.get(&(address + i as u64)) {
                Some(&b) => *out = b,
                None => return false,
            }
        }
        true
    }
}

const META: u64 = 0x1000;
const FUNCTION_MAP: u64 = 0x2000;
const SHARED_MAP: u64 = 0x2100;
const ONE_BYTE_MAP: u64 = 0x2200;
const SCRIPT_MAP: u64 = 0x2300;
const CONS_MAP: u64 = 0x2400;
const TWO_BYTE_MAP: u64 = 0x2500;
const SCOPE_INFO_MAP: u64 = 0x2600;
const FIXED_ARRAY_MAP: u64 = 0x2700;

fn smi(value: u64) -> u64 {
    value << 32
}

/// A heap with `hot` (named by a string, in a script whose name is a cons
/// of a one-byte and a two-byte string) and `caller` (named through its
/// ScopeInfo, starting at position 40: line 2).
fn heap() -> FakeMemory {
    let mut m = FakeMemory::default();
    m.map(META, 255);
    m.map(FUNCTION_MAP, 2066);
    m.map(SHARED_MAP, 262);
    m.map(ONE_BYTE_MAP, 8);
    m.map(SCRIPT_MAP, 167);
    m.map(CONS_MAP, 41);
    m.map(TWO_BYTE_MAP, 32);
    m.map(SCOPE_INFO_MAP, 261);
    m.map(FIXED_ARRAY_MAP, 175);
    // function hot
    m.word(0x10000, FUNCTION_MAP | 1);
    m.word(0x10000 + 24, 0x11001);
    m.word(0x11000, SHARED_MAP | 1);
    m.word(0x11000 + 16, 0x12001);
    m.word(0x11000 + 32, 0x13001);
    m.one_byte(0x12000, "hot");
    m.word(0x13000, SCRIPT_MAP | 1);
    m.word(0x13000 + 16, 0x14001);
    m.word(0x13000 + 56, 0x16001);
    m.word(0x14000, CONS_MAP | 1);
    m.word(0x14000 + 16, 0x15001);
    m.word(0x14000 + 24, 0x15101);
    m.one_byte(0x15000, "/app/");
    m.word(0x15100, TWO_BYTE_MAP | 1);
    m.put(0x15100 + 12, &7i32.to_le_bytes());
    let units: Vec<u8> = "main.js"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    m.put(0x15100 + 16, &units);
    m.word(0x16000, FIXED_ARRAY_MAP | 1);
    m.word(0x16000 + 8, smi(3));
    for (i, end) in [10, 50, 200].into_iter().enumerate() {
        m.word(0x16000 + 16 + 8 * i as u64, smi(end));
    }
    // function caller, named by its ScopeInfo
    m.word(0x20000, FUNCTION_MAP | 1);
    m.word(0x20000 + 24, 0x21001);
    m.word(0x21000, SHARED_MAP | 1);
    m.word(0x21000 + 16, 0x22001);
    m.word(0x21000 + 32, 0x13001);
    m.word(0x22000, SCOPE_INFO_MAP | 1);
    let slots = [
        smi(0),
        smi(0),
        smi(1),
        0x23001,
        smi(5),
        0x24001,
        smi(40),
        smi(100),
    ];
    for (i, slot) in slots.into_iter().enumerate() {
        m.word(0x22000 + 8 + 8 * i as u64, slot);
    }
    for i in slots.len()..SCOPE_INFO_SLOTS {
        m.word(0x22000 + 8 + 8 * i as u64, 0);
    }
    m.one_byte(0x23000, "local");
    m.one_byte(0x24000, "caller");
    m
}

fn layout() -> V8Layout {
    V8Layout::from_constants(&node20_constants()).expect("layout")
}

#[test]
fn functions_are_named_with_their_script_and_line() {
    let (layout, memory) = (layout(), heap());
    let mut maps = HashMap::new();
    let mut heap = Heap::new(&layout, &memory, &mut maps);
    let shared = heap.shared_of_function(0x10001).expect("a JSFunction");
    assert_eq!(shared, 0x11000);
    let hot = heap.describe(shared);
    assert_eq!(hot.name, "hot");
    assert_eq!(hot.file, "/app/main.js");
    assert_eq!(hot.line, 0, "a name held as a string gives no position");
    let caller = heap.shared_of_function(0x20001).expect("a JSFunction");
    let caller = heap.describe(caller);
    assert_eq!(caller.name, "caller");
    assert_eq!(caller.line, 2);
    // Maps checked once are remembered.
    let before = memory.reads.get();
    heap.shared_of_function(0x10001).expect("again");
    assert_eq!(
        memory.reads.get() - before,
        3,
        "two maps and the shared field"
    );
}

#[test]
fn objects_of_the_wrong_type_or_unreadable_are_refused() {
    let (layout, mut memory) = (layout(), heap());
    let mut maps = HashMap::new();
    {
        let mut heap = Heap::new(&layout, &memory, &mut maps);
        assert_eq!(
            heap.shared_of_function(0x11001),
            None,
            "an SFI is no function"
        );
        assert_eq!(
            heap.shared_of_function(0x10000),
            None,
            "a Smi, not a pointer"
        );
        assert_eq!(heap.shared_of_function(0x99001), None, "unmapped");
        assert_eq!(heap.string(0x13001), None, "a script is no string");
    }
    // A map whose map is not the meta map is no map.
    memory.word(FUNCTION_MAP, SHARED_MAP | 1);
    let mut maps = HashMap::new();
    let mut heap = Heap::new(&layout, &memory, &mut maps);
    assert_eq!(heap.shared_of_function(0x10001), None);
}

#[test]
fn forged_strings_cost_bounded_reads() {
    let (layout, mut memory) = (layout(), heap());
    // A cons string whose halves are itself, and a huge length.
    memory.word(0x14000 + 16, 0x14001);
    memory.word(0x14000 + 24, 0x14001);
    memory.put(0x12000 + 12, &i32::MAX.to_le_bytes());
    memory.put(0x12000 + 16, &vec![b'a'; MAX_NAME_BYTES]);
    let mut maps = HashMap::new();
    let mut heap = Heap::new(&layout, &memory, &mut maps);
    let before = memory.reads.get();
    assert_eq!(heap.string(0x14001), None, "a cycle ends at the depth cap");
    assert!(
        memory.reads.get() - before < 1 << 10,
        "{}",
        memory.reads.get() - before
    );
    let long = heap.string(0x12001).expect("cut to the cap");
    assert_eq!(long.len(), MAX_NAME_BYTES);
}

#[test]
fn lines_are_counted_in_the_source_until_v8_computes_line_ends() {
    let (layout, mut memory) = (layout(), heap());
    // caller's script: line ends not computed (a non-array), and the source
    // a cons of a one-byte and a two-byte string.
    memory.word(0x21000 + 32, 0x30001);
    memory.word(0x30000, SCRIPT_MAP | 1);
    memory.word(0x30000 + 16, 0x12001);
    memory.word(0x30000 + 56, 0x12001);
    memory.word(0x30000 + 8, 0x31001);
    memory.word(0x31000, CONS_MAP | 1);
    memory.word(0x31000 + 16, 0x32001);
    memory.word(0x31000 + 24, 0x33001);
    memory.one_byte(0x32000, "// a\n\n");
    let text = "x\n".repeat(40);
    memory.word(0x33000, TWO_BYTE_MAP | 1);
    memory.put(0x33000 + 12, &(text.len() as i32).to_le_bytes());
    let units: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
    memory.put(0x33000 + 16, &units);
    let mut maps = HashMap::new();
    let mut heap = Heap::new(&layout, &memory, &mut maps);
    let caller = heap.shared_of_function(0x20001).expect("a JSFunction");
    let caller = heap.describe(caller);
    assert_eq!(caller.name, "caller");
    // Position 40: 6 one-byte characters (two newlines), then 34 two-byte
    // ones (17 newlines): line 20.
    assert_eq!(caller.line, 20);
}

#[test]
fn counting_lines_stops_at_the_source_budget() {
    let (layout, mut memory) = (layout(), heap());
    // caller's script has no line ends; its source holds 40 characters.
    memory.word(0x21000 + 32, 0x30001);
    memory.word(0x30000, SCRIPT_MAP | 1);
    memory.word(0x30000 + 16, 0x12001);
    memory.word(0x30000 + 56, 0x12001);
    memory.word(0x30000 + 8, 0x31001);
    memory.one_byte(0x31000, &"x\n".repeat(20));
    let mut maps = HashMap::new();
    let heap = Heap::new(&layout, &memory, &mut maps);
    let mut heap = heap.with_source_budget(39);
    let caller = heap.shared_of_function(0x20001).expect("a JSFunction");
    assert_eq!(
        heap.describe(caller).line,
        0,
        "40 bytes are over the budget"
    );
    assert_eq!(heap.source_budget_left(), 39);
    let mut heap = Heap::new(&layout, &memory, &mut maps).with_source_budget(100);
    assert_eq!(heap.describe(caller).line, 21);
    assert_eq!(heap.source_budget_left(), 60);
}
