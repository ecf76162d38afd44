//! Naming one unwound frame of a JVM: the code blob its pc lies in says
//! whether it is compiled (its method, and those inlined into it at that
//! pc), interpreted (the method in its frame) or a stub (its name). Names
//! and scopes are cached for one window only: code and methods are freed
//! and their memory reused.

use std::collections::HashMap;
use std::sync::Arc;

use crate::unwind::FrameRegisters;

use super::code_cache::{BlobKind, CodeBlob};
use super::frames::{JavaFrameName, JavaFrameTable};
use super::inline::{self, NmethodScopes};
use super::layout::INTERPRETER_BCP_SLOTS;
use super::names::{self, MethodName};
use super::unwinder::JvmProcess;

/// PcDescs held in the window's scope cache at most (8 bytes each).
const MAX_CACHED_PC_DESCS: usize = 1 << 20;

/// What one window has read of methods and nmethods, across processes.
#[derive(Debug)]
pub struct WindowNames {
    pub frames: JavaFrameTable,
    methods: HashMap<(u32, u64, u64), Option<Arc<MethodName>>>,
    scopes: HashMap<(u32, u64, u64), Option<Arc<NmethodScopes>>>,
    cached_pc_descs: usize,
}

impl WindowNames {
    pub fn new(frames_per_window: usize) -> WindowNames {
        WindowNames {
            frames: JavaFrameTable::new(frames_per_window),
            methods: HashMap::new(),
            scopes: HashMap::new(),
            cached_pc_descs: 0,
        }
    }

    pub fn clear(&mut self) {
        self.frames.clear();
        self.methods.clear();
        self.scopes.clear();
        self.cached_pc_descs = 0;
    }
}

/// Names the frames of one stack of one JVM.
#[derive(Debug)]
pub struct Namer<'a> {
    pub jvm: &'a JvmProcess,
    pub key: (u32, u64),
    pub window: &'a mut WindowNames,
    pub counts: &'a mut HashMap<&'static str, u64>,
    pub max_cached_methods: usize,
}

impl Namer<'_> {
    /// The tagged Java frames for the frame at `depth` (`entry`, with
    /// `registers`), innermost first; empty to keep `entry` as it is.
    pub fn name(
        &mut self,
        depth: usize,
        entry: u64,
        registers: FrameRegisters,
        read_stack: &dyn Fn(u64) -> Option<u64>,
    ) -> Vec<u64> {
        // Callers hold return addresses; one byte back is inside the call.
        let pc = if depth == 0 {
            entry
        } else {
            entry.saturating_sub(1)
        };
        if !self.jvm.in_code_cache(pc) {
            return Vec::new();
        }
        let Some(blob) = self.jvm.blob(pc) else {
            self.count("no_blob");
            return Vec::new();
        };
        let scopes: Vec<(u64, Option<u32>)> = match &blob.kind {
            BlobKind::Nmethod { method } => {
                let mut scopes = self.inlined(&blob, pc);
                if scopes.last().is_none_or(|(outer, _)| outer != method) {
                    scopes = vec![(*method, None)];
                }
                scopes
            }
            BlobKind::Interpreter => {
                let layout = &self.jvm.found.layout;
                let slot = registers
                    .bp
                    .wrapping_add_signed(layout.interpreter_method_slot * 8);
                let Some(method) = read_stack(slot) else {
                    self.count("interpreted_unreadable");
                    return Vec::new();
                };
                let bci = INTERPRETER_BCP_SLOTS.iter().find_map(|&slot| {
                    let bcp = read_stack(registers.bp.wrapping_add_signed(slot * 8))?;
                    names::bytecode_index(&self.jvm.memory, layout, method, bcp)
                });
                vec![(method, bci)]
            }
            BlobKind::Stub { name } => {
                self.count("stub");
                return vec![self.window.frames.intern(JavaFrameName {
                    function: Arc::from(name.as_str()),
                    file: Arc::from(""),
                    line: 0,
                })];
            }
        };
        let kind = match (&blob.kind, scopes.len()) {
            (BlobKind::Interpreter, _) => "interpreted",
            (_, 1) => "compiled",
            _ => "compiled_inlined",
        };
        let mut named = Vec::with_capacity(scopes.len());
        for (method, bci) in scopes {
            let Some(name) = self.method(method) else {
                self.count("method_unreadable");
                return Vec::new();
            };
            let line = bci.map_or(0, |bci| {
                names::line_of(&self.jvm.memory, &self.jvm.found.layout, method, bci)
            });
            named.push(self.window.frames.intern(JavaFrameName {
                function: Arc::from(name.function.as_str()),
                file: Arc::from(name.file.as_str()),
                line,
            }));
        }
        self.count(kind);
        named
    }

    /// The methods run at `pc` in a compiled blob, innermost first; empty
    /// when the JDK's scopes are not read or nothing is recorded there.
    fn inlined(&mut self, blob: &CodeBlob, pc: u64) -> Vec<(u64, Option<u32>)> {
        let Some(layout) = &self.jvm.found.layout.inline else {
            return Vec::new();
        };
        let key = (self.key.0, self.key.1, blob.address);
        let scopes = match self.window.scopes.get(&key) {
            Some(scopes) => scopes.clone(),
            None => {
                let scopes =
                    inline::read_scopes(&self.jvm.memory, layout, blob.address).map(Arc::new);
                let size = scopes.as_ref().map_or(0, |s| s.len());
                if self.window.cached_pc_descs + size > MAX_CACHED_PC_DESCS {
                    self.window.scopes.clear();
                    self.window.cached_pc_descs = 0;
                }
                self.window.cached_pc_descs += size;
                self.window.scopes.insert(key, scopes.clone());
                scopes
            }
        };
        let (Some(scopes), BlobKind::Nmethod { method }) = (scopes, &blob.kind) else {
            return Vec::new();
        };
        // The stream's encoding changed in JDK 21 and nothing in the
        // tables says which one a JVM uses: the right one leads out to the
        // nmethod's own method.
        let offset = pc.saturating_sub(blob.code_begin);
        [0, 1]
            .into_iter()
            .map(|excluded| inline::scopes_at(&self.jvm.memory, &scopes, offset, excluded))
            .find(|found| found.last().is_some_and(|(outer, _)| outer == method))
            .unwrap_or_default()
    }

    fn method(&mut self, method: u64) -> Option<Arc<MethodName>> {
        let key = (self.key.0, self.key.1, method);
        if let Some(name) = self.window.methods.get(&key) {
            return name.clone();
        }
        let name =
            names::read_method(&self.jvm.memory, &self.jvm.found.layout, method).map(Arc::new);
        if self.window.methods.len() >= self.max_cached_methods {
            self.window.methods.clear();
        }
        self.window.methods.insert(key, name.clone());
        name
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }
}
