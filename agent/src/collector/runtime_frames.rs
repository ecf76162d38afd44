//! Runtimes' own frames in the collector: which readers run, and putting
//! the frames they name back among the native frames of a stack.

use std::sync::Arc;

use super::Collector;
use crate::python::frames::is_python_frame;
use crate::sample_source::SampleSource;
use crate::symbolize::Frame;
use crate::target_set::TargetSource;

/// Which runtimes' frames the collector reads from their VMs, each on its
/// own, so that an operator can turn one reader off without the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeReaders {
    /// Ruby (CRuby) frames.
    pub ruby: bool,
    /// Java frames of HotSpot JVMs.
    pub java: bool,
    /// JavaScript frames of V8 (Node).
    pub javascript: bool,
}

impl Default for RuntimeReaders {
    fn default() -> Self {
        RuntimeReaders {
            ruby: true,
            java: true,
            javascript: true,
        }
    }
}

impl<S: TargetSource, K: SampleSource> Collector<S, K> {
    /// `native` frames (of the untagged entries of `stack`, in order) with
    /// the Python frames of `stack` put back where they were.
    pub(super) fn weave_python_frames(&self, stack: &[u64], native: Vec<Frame>) -> Vec<Frame> {
        let (python, ruby) = (self.python.as_ref(), self.ruby.as_ref());
        if (python.is_none() && ruby.is_none() && self.hotspot.is_none())
            || !stack.iter().any(|&e| is_python_frame(e))
        {
            return native;
        }
        let mut native = native.into_iter();
        stack
            .iter()
            .filter_map(|&entry| {
                if !is_python_frame(entry) {
                    return native.next();
                }
                if let Some(java) = self.hotspot.as_ref().and_then(|h| h.frame(entry)) {
                    return Some(Frame {
                        address: 0,
                        mapping: None,
                        function: Some(Arc::clone(&java.function)),
                        file: Some(Arc::clone(&java.file)).filter(|f| !f.is_empty()),
                        line: java.line,
                    });
                }
                let name = ruby
                    .and_then(|r| r.frame(entry))
                    .or_else(|| python?.frame(entry))?;
                Some(Frame {
                    address: 0,
                    mapping: None,
                    function: Some(Arc::clone(&name.function)),
                    file: Some(Arc::clone(&name.file)),
                    line: name.line,
                })
            })
            .collect()
    }
}
