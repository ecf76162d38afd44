// The sandwich view of one function: its callers, merged over every place
// it appears, and its callees, merged the same way, as two trees in the
// store's flame graph shape ({names, root, node_count}) so they lay out and
// draw like any flame graph. Pure: a tree in, two trees out.
//
// Only the outermost appearance of the function on each stack counts, so a
// recursive function is not counted twice; the trees' roots carry the same
// total, the function's cumulative value.

function newNode(name) {
  return { name, total: 0, self: 0, children: [], index: null };
}

function childNamed(node, name) {
  if (!node.index) node.index = new Map();
  let child = node.index.get(name);
  if (!child) {
    child = newNode(name);
    node.index.set(name, child);
    node.children.push(child);
  }
  return child;
}

// Adds the subtree `source` (store shape) into `target`, iteratively.
function mergeInto(target, source) {
  const pending = [[target, source]];
  while (pending.length) {
    const [into, from] = pending.pop();
    into.total += Number(from.total) || 0;
    into.self += Number(from.self) || 0;
    for (const child of from.children || []) pending.push([childNamed(into, child.name), child]);
  }
}

// Largest total first, like the store's trees, equal totals by name;
// drops the lookup maps and counts the nodes.
//
// NB: ties were broken by name index, which is the order the store's
// answer happened to list names in: reloading a sandwich's link could
// list two equal callers the other way round.
function finish(root, names) {
  const byName = (a, b) => {
    const [x, y] = [String(names[a.name] ?? ''), String(names[b.name] ?? '')];
    return x < y ? -1 : x > y ? 1 : 0;
  };
  let count = 0;
  const pending = [root];
  while (pending.length) {
    const node = pending.pop();
    count += 1;
    delete node.index;
    node.children.sort((a, b) => b.total - a.total || byName(a, b));
    for (const child of node.children) pending.push(child);
  }
  return count;
}

// `graph` is a store flame graph; `functionName` a frame name in it.
// Returns {callers, callees, total}: `callers` has the function at its root
// and each caller one level further out; `callees` has the function at its
// root and what it called below. Both are empty (total 0) when the function
// is not in the graph.
export function sandwichGraphs(graph, functionName) {
  const names = graph.names || [];
  const target = names.indexOf(functionName);
  const callersRoot = newNode(target < 0 ? 0 : target);
  const calleesRoot = newNode(target < 0 ? 0 : target);
  if (target >= 0) {
    // Depth-first with the path of frame names from the root; the walk
    // does not descend below an appearance, so only outermost ones count.
    const path = [];
    const pending = [{ node: graph.root, depth: 0 }];
    while (pending.length) {
      const { node, depth } = pending.pop();
      path.length = depth;
      path.push(node.name);
      if (depth > 0 && node.name === target) {
        const value = Number(node.total) || 0;
        mergeInto(calleesRoot, node);
        // Callers from the nearest outward, leaving out the synthetic root;
        // the outermost frame (where the stack starts) holds the value as self.
        callersRoot.total += value;
        let caller = callersRoot;
        for (let d = depth - 1; d >= 1; d -= 1) {
          caller = childNamed(caller, path[d]);
          caller.total += value;
        }
        caller.self += value;
        continue;
      }
      const children = node.children || [];
      for (let i = children.length - 1; i >= 0; i -= 1) pending.push({ node: children[i], depth: depth + 1 });
    }
  }
  const callerCount = finish(callersRoot, names);
  const calleeCount = finish(calleesRoot, names);
  return {
    total: calleesRoot.total,
    callers: { names, root: callersRoot, node_count: callerCount },
    callees: { names, root: calleesRoot, node_count: calleeCount },
  };
}
