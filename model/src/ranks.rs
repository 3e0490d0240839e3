//! The ranks of a tensor split run by one process: a single-device scheduler per GPU over that
//! rank's own graph (its slices and KV part, plus a copy of everything not split), all stepping
//! the same inputs. Each rank sums its partials with the others' through its own collective, so
//! every rank ends with the whole model's outputs and rank 0's are the ones read.
//!
//! A run whose every rank replays a captured graph is queued from the calling thread, rank after
//! rank (a replay waits for nothing); any other run (the first of a shape, its capture, a prompt)
//! gives each further rank a thread, since a rank launching node by node waits on collectives the
//! other ranks must reach.

use std::sync::Arc;

use ggml_graph::{Graph, Leaf, Op, Scheduler, TensorId};

use crate::error::ModelError;
use crate::session::Model;

/// Builds the graph of the pass being run from a rank's model (its weight table names its
/// slices and KV part): the same builder call the session made for rank 0.
pub(crate) type RankGraph<'a> = &'a dyn Fn(&Model) -> Result<Graph, ModelError>;

/// What each rank's graph goes through before it runs (the engine's optimizer).
pub(crate) type Optimize = Box<dyn Fn(&mut Graph) + Send + Sync>;

/// Called with the error of a rank that failed: the other ranks may wait on a collective the
/// failed one never joins (the engine aborts their communicators).
pub(crate) type OnError = Box<dyn Fn(&str) + Send + Sync>;

/// Keyed runs whose rank graphs are kept.
const CACHED: usize = 8;

/// A rank other than 0: its scheduler and its model.
pub(crate) struct Rank {
    pub sched: Scheduler,
    pub model: Model,
}

/// One rank's graph of a pass, with its inputs' ids by rank 0's.
struct Built {
    graph: Graph,
    /// `(rank 0's id, this graph's id)` of every input leaf.
    inputs: Vec<(TensorId, TensorId)>,
}

/// Ranks 1.. of a tensor split (rank 0's scheduler is the engine's own) and their graphs.
pub(crate) struct Ranks {
    rest: Vec<Rank>,
    optimize: Optimize,
    on_error: OnError,
    /// Rank graphs of keyed runs: key, nodes of rank 0's graph, one graph per rank 1...
    cache: Vec<(u64, usize, Arc<Vec<Built>>)>,
}

impl Ranks {
    /// Ranks 1.. (`rest`), whose graphs go through `optimize`.
    pub(crate) fn new(rest: Vec<Rank>, optimize: Optimize, on_error: OnError) -> Self {
        Self {
            rest,
            optimize,
            on_error,
            cache: Vec::new(),
        }
    }

    /// The schedulers of ranks 1...
    pub(crate) fn schedulers(&self) -> impl Iterator<Item = &Scheduler> {
        self.rest.iter().map(|r| &r.sched)
    }

    /// The scheduler of rank `r` (1..).
    pub(crate) fn scheduler(&self, r: usize) -> Option<&Scheduler> {
        self.rest.get(r.checked_sub(1)?).map(|r| &r.sched)
    }

    /// Turns capture of repeated keyed runs on or off on ranks 1...
    pub(crate) fn set_graph_capture(&mut self, on: bool) {
        for r in &mut self.rest {
            r.sched.set_graph_capture(on);
        }
    }

    /// Runs `graph` (rank 0's, on `first`) and each further rank's graph of the same pass
    /// (made by `build`, kept per `key`) with the same `inputs`.
    pub(crate) fn run(
        &mut self,
        first: &mut Scheduler,
        key: Option<u64>,
        graph: &Graph,
        inputs: &[(TensorId, &[u8])],
        build: RankGraph<'_>,
    ) -> Result<(), ModelError> {
        let built = self.graphs(key, graph, build)?;
        let mut per_rank: Vec<Vec<(TensorId, &[u8])>> = Vec::with_capacity(built.len());
        for b in built.iter() {
            let mut mine = Vec::with_capacity(inputs.len());
            for (id, data) in inputs {
                let (_, theirs) = b.inputs.iter().find(|(o, _)| o == id).ok_or_else(|| {
                    ModelError::InvalidArgument(format!(
                        "tensor split: input {} has no counterpart in another rank's graph",
                        id.index()
                    ))
                })?;
                mine.push((*theirs, *data));
            }
            per_rank.push(mine);
        }
        let replay = first.would_replay(key, graph)
            && (self.rest.iter().zip(built.iter()))
                .all(|(r, b)| r.sched.would_replay(key, &b.graph));
        let on_error = &self.on_error;
        let fail = |e: ggml_graph::GraphError| {
            let e = ModelError::from(e);
            on_error(&e.to_string());
            e
        };
        if replay {
            first.run_keyed(key, graph, inputs).map_err(fail)?;
            for ((r, b), inp) in self.rest.iter_mut().zip(built.iter()).zip(&per_rank) {
                r.sched.run_keyed(key, &b.graph, inp).map_err(fail)?;
            }
            return Ok(());
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = (self.rest.iter_mut().zip(built.iter()).zip(&per_rank))
                .map(|((r, b), inp)| {
                    let fail = &fail;
                    s.spawn(move || {
                        // A rank that panics must still release the ranks waiting on it.
                        let run = std::panic::AssertUnwindSafe(|| {
                            r.sched.run_keyed(key, &b.graph, inp).map_err(fail)
                        });
                        std::panic::catch_unwind(run).unwrap_or_else(|_| {
                            let e =
                                ModelError::Device("a tensor-split rank's thread panicked".into());
                            on_error(&e.to_string());
                            Err(e)
                        })
                    })
                })
                .collect();
            let mine = first.run_keyed(key, graph, inputs).map_err(fail);
            let mut result = mine;
            for h in handles {
                let r = h.join().unwrap_or_else(|_| {
                    Err(ModelError::Device(
                        "a tensor-split rank's thread panicked".into(),
                    ))
                });
                if result.is_ok() {
                    result = r;
                }
            }
            result
        })
    }

    /// The graphs of ranks 1.. for the pass of rank 0's `graph`: kept ones for a seen `key`.
    fn graphs(
        &mut self,
        key: Option<u64>,
        graph: &Graph,
        build: RankGraph<'_>,
    ) -> Result<Arc<Vec<Built>>, ModelError> {
        if let Some(k) = key {
            if let Some((_, _, b)) =
                (self.cache.iter()).find(|(c, n, _)| *c == k && *n == graph.len())
            {
                return Ok(Arc::clone(b));
            }
        }
        let mine = input_leaves(graph);
        let mut built = Vec::with_capacity(self.rest.len());
        for r in &self.rest {
            let mut g = build(&r.model)?;
            (self.optimize)(&mut g);
            let theirs = input_leaves(&g);
            let mut inputs = Vec::with_capacity(mine.len());
            for (name, id) in &mine {
                let (_, t) = theirs.iter().find(|(n, _)| n == name).ok_or_else(|| {
                    ModelError::InvalidArgument(format!(
                        "tensor split: another rank's graph has no input `{name}`"
                    ))
                })?;
                inputs.push((*id, *t));
            }
            built.push(Built { graph: g, inputs });
        }
        let built = Arc::new(built);
        if let Some(k) = key {
            if self.cache.len() == CACHED {
                self.cache.remove(0);
            }
            self.cache.push((k, graph.len(), Arc::clone(&built)));
        }
        Ok(built)
    }
}

/// `(name, id)` of a graph's input leaves.
fn input_leaves(g: &Graph) -> Vec<(String, TensorId)> {
    g.tensors()
        .iter()
        .enumerate()
        .filter(|(_, t)| t.op == Op::Leaf(Leaf::Input))
        .map(|(i, t)| (t.name.clone(), TensorId::from_index(i)))
        .collect()
}
