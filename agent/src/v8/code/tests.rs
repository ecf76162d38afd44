use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use super::*;
use crate::v8::inlining::SourcePosition;
use crate::v8::layout::V8Layout;
use crate::v8::layout::tests::node20_constants;

/// A process's memory as sparse bytes, counting bytes read.
#[derive(Debug, Default)]
struct FakeMemory {
    bytes: HashMap<u64, u8>,
    read: Cell<u64>,
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
    fn map(&mut self, address: u64, instance_type: u16) {
        self.word(address, META | 1);
        self.put(address + 12, &instance_type.to_le_bytes());
    }
    /// A byte array (of the trusted kind) holding `bytes`.
    fn byte_array(&mut self, address: u64, bytes: &[u8]) {
        self.word(address, BYTE_ARRAY_MAP | 1);
        self.word(address + 8, smi(bytes.len() as u64));
        self.put(address + 16, bytes);
    }
    fn array(&mut self, address: u64, map: u64, elements: &[u64]) {
        self.word(address, map | 1);
        self.word(address + 8, smi(elements.len() as u64));
        for (i, &e) in elements.iter().enumerate() {
            self.word(address + 16 + 8 * i as u64, e);
        }
    }
}

impl Memory for FakeMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        self.read.set(self.read.get() + buffer.len() as u64);
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
const SHARED_MAP: u64 = 0x2100;
const STREAM_MAP: u64 = 0x3000;
const CODE_MAP: u64 = 0x3100;
const DEOPT_MAP: u64 = 0x3200;
const BYTE_ARRAY_MAP: u64 = 0x3300;
const LITERALS_MAP: u64 = 0x3400;
const WRAPPER_MAP: u64 = 0x3500;

const HOT: u64 = 0x11000;
const CALLER: u64 = 0x21000;
const CODE: u64 = 0x50000;
/// JIT code: the instruction stream's header, then its instructions.
const STREAM: u64 = 0x7000_0000;
const START: u64 = STREAM + 32;
const SIZE: u64 = 0x600;

fn smi(value: u64) -> u64 {
    value << 32
}

fn at(offset: u32, id: u16) -> SourcePosition {
    SourcePosition((u64::from(id) << 31) | (u64::from(offset + 1) << 1))
}

/// Node 20's constants with those of Node 24 (V8 13.6) that describe
/// optimized code.
fn constants() -> BTreeMap<String, i64> {
    let mut constants = node20_constants();
    for (name, value) in [
        ("CodeKindBaseline", 10),
        ("CodeKindFieldMask", 15),
        ("CodeKindFieldShift", 0),
        ("DeoptimizationDataInlinedFunctionCountIndex", 1),
        ("DeoptimizationDataInliningPositionsIndex", 8),
        ("DeoptimizationDataLiteralArrayIndex", 3),
        ("DeoptimizationDataWrappedSharedFunctionInfoIndex", 7),
        ("class_Code__flags__uint32_t", 52),
        ("class_Code__instruction_size__int", 56),
        ("class_Code__instruction_start__Address", 40),
        (
            "class_Code__instruction_stream__Tagged_InstructionStream_",
            32,
        ),
        ("class_Code__wrapper__Tagged_CodeWrapper_", 24),
        (
            "class_SharedFunctionInfoWrapper__shared_info__Tagged_SharedFunctionInfo_",
            8,
        ),
        ("type_Code__CODE_TYPE", 187),
        ("type_InstructionStream__INSTRUCTION_STREAM_TYPE", 192),
        ("type_ProtectedFixedArray__PROTECTED_FIXED_ARRAY_TYPE", 193),
        (
            "type_SharedFunctionInfoWrapper__SHARED_FUNCTION_INFO_WRAPPER_TYPE",
            195,
        ),
        ("type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE", 196),
        (
            "type_TrustedWeakFixedArray__TRUSTED_WEAK_FIXED_ARRAY_TYPE",
            199,
        ),
    ] {
        constants.insert(name.to_owned(), value);
    }
    constants
}

fn layout() -> V8Layout {
    V8Layout::from_constants(&constants()).expect("layout")
}

/// Encodes a source position table as V8 does.
fn table(entries: &[(i64, SourcePosition)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let (mut code, mut source) = (-1i64, 0i64);
    for &(offset, position) in entries {
        for value in [offset - code, position.0 as i64 - source] {
            let mut encoded = ((value << 1) ^ (value >> 63)) as u64;
            loop {
                let more = encoded > 0x7f;
                bytes.push((encoded & 0x7f) as u8 | if more { 0x80 } else { 0 });
                encoded >>= 7;
                if !more {
                    break;
                }
            }
        }
        code = offset;
        source = position.0 as i64;
    }
    bytes
}

/// A Maglev code object for `caller`, with `hot` inlined at offsets
/// 0x40..0x80, its instructions in a page of JIT code.
fn process() -> FakeMemory {
    let mut m = FakeMemory::default();
    m.map(META, 255);
    m.map(SHARED_MAP, 262);
    m.map(STREAM_MAP, 192);
    m.map(CODE_MAP, 187);
    m.map(DEOPT_MAP, 193);
    m.map(BYTE_ARRAY_MAP, 196);
    m.map(LITERALS_MAP, 199);
    m.map(WRAPPER_MAP, 195);
    m.word(HOT, SHARED_MAP | 1);
    m.word(CALLER, SHARED_MAP | 1);
    // Instructions full of words that look tagged, as machine code may.
    for offset in (0..0x2000).step_by(8) {
        m.word(STREAM - 0x800 + offset, 0x0000_4141_0000_0001);
    }
    m.word(STREAM, STREAM_MAP | 1);
    m.word(STREAM + 8, CODE | 1);
    m.word(CODE, CODE_MAP | 1);
    m.word(CODE + 8, 0x51001);
    m.word(CODE + 16, 0x52001);
    m.word(CODE + 32, STREAM | 1);
    m.word(CODE + 40, START);
    m.put(CODE + 52, &11u32.to_le_bytes());
    m.put(CODE + 56, &(SIZE as i32).to_le_bytes());
    let mut deopt = vec![smi(0); 9];
    deopt[1] = smi(1);
    deopt[3] = 0x53001;
    deopt[7] = 0x54001;
    deopt[8] = 0x55001;
    m.array(0x51000, DEOPT_MAP, &deopt);
    m.byte_array(
        0x52000,
        &table(&[(0, at(1, 0)), (0x40, at(40, 1)), (0x80, at(200, 0))]),
    );
    // The literal is a weak reference to hot's SharedFunctionInfo.
    m.array(0x53000, LITERALS_MAP, &[HOT | 3]);
    m.word(0x54000, WRAPPER_MAP | 1);
    m.word(0x54008, CALLER | 1);
    let mut inlining = at(218, 0).0.to_le_bytes().to_vec();
    inlining.extend_from_slice(&[0, 0, 0, 0, 0xd0, 0x7f, 0, 0]);
    m.byte_array(0x55000, &inlining);
    m
}

fn scanner() -> Scanner {
    Scanner {
        map: None,
        budget: 1 << 20,
    }
}

fn find(memory: &FakeMemory, scanner: &mut Scanner, pc: u64) -> Option<OptimizedCode> {
    let layout = layout();
    let code = layout.code.expect("Node 24's constants describe code");
    let mut maps = HashMap::new();
    let mut heap = Heap::new(&layout, memory, &mut maps);
    code_at(&mut heap, &code, scanner, pc)
}

#[test]
fn node_24_constants_describe_code_and_node_20_s_do_not() {
    let code = layout().code.expect("code layout");
    // The two tables' offsets come from the wrapper's when not exported.
    assert_eq!(code.deoptimization_data, 8);
    assert_eq!(code.source_positions, 16);
    assert_eq!(code.baseline_kind, 10);
    assert!(matches!(
        code.optimized_function,
        Some(OptimizedFunction::Wrapped { index: 7, .. })
    ));
    let node20 = V8Layout::from_constants(&node20_constants()).expect("layout");
    assert_eq!(node20.code, None);
}

#[test]
fn a_pc_in_optimized_code_names_the_functions_inlined_there() {
    let memory = process();
    let mut scanner = scanner();
    let pc = START + 0x50;
    let found = find(&memory, &mut scanner, pc).expect("code found");
    assert_eq!((found.start, found.end), (START, START + SIZE));
    assert_eq!(found.shared, Some(CALLER));
    assert_eq!(found.functions, vec![Some(HOT)]);
    assert_eq!(found.inlined_at(pc, false), vec![HOT]);
    // The optimized function's own code, and a return address just past
    // the inlined range (looked up in its call, one byte back).
    assert_eq!(found.inlined_at(START + 0x90, false), Vec::<u64>::new());
    assert_eq!(found.inlined_at(START + 0x80, true), vec![HOT]);
    assert_eq!(found.inlined_at(START + SIZE, false), Vec::<u64>::new());
    // The map is learnt: the next scan compares words to it.
    assert_eq!(scanner.map, Some(STREAM_MAP | 1));
    let again = find(&memory, &mut scanner, START + 0x100).expect("found again");
    assert_eq!(again, found);
}

#[test]
fn unoptimized_code_is_found_without_tables() {
    let mut memory = process();
    memory.put(CODE + 52, &10u32.to_le_bytes());
    let found = find(&memory, &mut scanner(), START + 0x50).expect("code found");
    assert!(found.positions.is_empty());
    assert_eq!(found.inlined_at(START + 0x50, false), Vec::<u64>::new());
}

#[test]
fn forged_or_missing_headers_cost_bounded_reads() {
    // A header whose code does not point back, then none within the cap
    // (the mapping is readable for 2 KiB before it only).
    let mut memory = process();
    memory.word(CODE + 32, 0x9999_0001);
    let mut scanner = scanner();
    assert_eq!(find(&memory, &mut scanner, START + 0x50), None);
    assert!(memory.read.get() < 64 << 10, "{} bytes", memory.read.get());
    // A pc past the code's instructions: the first header ends the scan.
    let memory = process();
    assert_eq!(
        find(&memory, &mut self::scanner(), START + SIZE + 0x40),
        None
    );
    // A budget smaller than a chunk: nothing is read.
    let mut poor = Scanner {
        map: None,
        budget: 100,
    };
    let memory = process();
    assert_eq!(find(&memory, &mut poor, START + 0x500), None);
    // A pc in unmapped memory.
    assert_eq!(find(&memory, &mut self::scanner(), 0x9000_0000), None);
}

#[test]
fn tables_that_are_not_the_expected_objects_give_no_inlined_functions() {
    // Inlining positions of the wrong type, and a literal that is no
    // SharedFunctionInfo: the code is found, its inlined functions are not.
    let mut memory = process();
    memory.word(0x55000, LITERALS_MAP | 1);
    let found = find(&memory, &mut scanner(), START + 0x50).expect("found");
    assert_eq!(found.inlined_at(START + 0x50, false), Vec::<u64>::new());
    let mut memory = process();
    memory.word(0x53010, 0x54001);
    let found = find(&memory, &mut scanner(), START + 0x50).expect("found");
    assert_eq!(found.functions, vec![None]);
    assert_eq!(found.inlined_at(START + 0x50, false), Vec::<u64>::new());
}
