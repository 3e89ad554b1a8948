package claimview

import (
	"strings"
	"sync"
)

// maxFailures bounds the failed prepares remembered; past it the oldest
// is forgotten first.
const maxFailures = 1024

// failures remembers, per claim (namespace/name) and pod UID, why the
// pod's last prepare failed for the claim. An entry goes when the pod's
// prepare of the claim succeeds, when the pod is released, when a list of
// the API no longer finds the claim (or finds another UID under its
// name), or, past maxFailures, the oldest first. Which entries there are
// depends only on those events, in each pod's order, so that the same
// history shows the same state.
type failures struct {
	mu  sync.Mutex
	seq uint64                         // of the last entry set
	m   map[string]map[string]*failure // claim → pod UID → failure
	n   int                            // entries in m
}

type failure struct {
	// uid is the claim's when the prepare failed; "": not known (the
	// failure is the name's).
	uid string
	why string
	seq uint64 // when it was set: the latest is shown, the oldest evicted
}

func (f *failures) set(claim, pod, uid, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]map[string]*failure{}
	}
	pods := f.m[claim]
	if pods[pod] == nil {
		if f.n >= maxFailures {
			f.evictOldest()
		}
		if pods = f.m[claim]; pods == nil {
			pods = map[string]*failure{}
			f.m[claim] = pods
		}
		f.n++
	}
	f.seq++
	pods[pod] = &failure{uid: uid, why: why, seq: f.seq}
}

// evictOldest forgets the entry set first (f.mu held).
func (f *failures) evictOldest() {
	var oc, op string
	var oldest uint64
	for c, pods := range f.m {
		for p, e := range pods {
			if oldest == 0 || e.seq < oldest {
				oc, op, oldest = c, p, e.seq
			}
		}
	}
	if oldest != 0 {
		f.drop(oc, op)
	}
}

// drop forgets one entry (f.mu held).
func (f *failures) drop(claim, pod string) {
	pods := f.m[claim]
	if pods[pod] == nil {
		return
	}
	delete(pods, pod)
	f.n--
	if len(pods) == 0 {
		delete(f.m, claim)
	}
}

func (f *failures) forget(claim, pod string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop(claim, pod)
}

func (f *failures) forgetPod(pod string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.m {
		f.drop(c, pod)
	}
}

// get returns the latest failure of claim with UID uid (or of its name).
func (f *failures) get(claim, uid string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var latest *failure
	for _, e := range f.m[claim] {
		if (e.uid == "" || e.uid == uid) && (latest == nil || e.seq > latest.seq) {
			latest = e
		}
	}
	if latest == nil {
		return "", false
	}
	return latest.why, true
}

// mark returns the sequence of the last entry set: prune spares those set
// after it.
func (f *failures) mark() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

// prune forgets the entries of namespace ("": every namespace) set up to
// since whose claim is not in listed (namespace/name → UID, as a list of
// the API begun after since found them) or is there with another UID.
func (f *failures) prune(namespace string, listed map[string]string, since uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c, pods := range f.m {
		if namespace != "" && !strings.HasPrefix(c, namespace+"/") {
			continue
		}
		uid, ok := listed[c]
		for p, e := range pods {
			if e.seq <= since && (!ok || (e.uid != "" && e.uid != uid)) {
				f.drop(c, p)
			}
		}
	}
}
