package chaos

import (
	"testing"
	"time"
)

// TestChaosIntents is the intents phase alone: the dramanager, a real
// process, SIGKILLed at each step of a prepare (after the allocation
// write, after Reserve, during NodePrepareResources, after the driver
// answered, after the commit) and of a release, with a real DRA driver on
// the upstream helper; after each restart the claim ends prepared for its
// pod (a kill after the commit) or fully rolled back (any other), and no
// intent is left: (l). It asserts no timing.
func TestChaosIntents(t *testing.T) {
	cfg := Config{Plugins: 2, Devices: 2, Clients: 1, Interval: 300 * time.Millisecond,
		CompactBytes: 16 << 10, Intents: true, Converge: 2 * time.Minute}
	res := runChaos(t, cfg)
	if len(res.Intents.Steps) != len(intentSteps) || res.Kills["dramanager"] < len(intentSteps) {
		t.Fatalf("steps %+v, %d dramanager kills; want all %d steps, each a kill", res.Intents.Steps, res.Kills["dramanager"], len(intentSteps))
	}
	for i, r := range res.Intents.Steps {
		if st := intentSteps[i]; r.Step != st.name || r.Outcome != st.want {
			t.Errorf("kill %s: %s, want %s", r.Step, r.Outcome, st.want)
		}
	}
}
