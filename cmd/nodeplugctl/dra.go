package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
)

// cmdDrivers lists the registered drivers: the reconciler's CSI and DRA
// drivers, then each DRA driver instance the dramanager holds and its
// connection.
func cmdDrivers(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("drivers", "[-o table|json]")
	out := c.outputFlag(fs, "table", "json")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json"); err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	cc, err := c.conn(reconcilerSvc)
	if err != nil {
		return err
	}
	resp, err := reconcilerv1.NewReconcilerServiceClient(cc).ListDrivers(cctx, &reconcilerv1.ListDriversRequest{})
	if err != nil {
		return c.rpcError(reconcilerSvc, "list drivers", err)
	}
	dra, err := c.draDrivers(cctx)
	if err != nil {
		// The reconciler's list is still worth showing.
		fmt.Fprintf(c.stderr, "nodeplugctl drivers: the dramanager's DRA driver connections are not listed: %v\n", err)
	}
	if *out == "json" {
		return writeDriversJSON(c.stdout, resp, dra)
	}
	if err := renderDrivers(c.stdout, now(), resp); err != nil {
		return err
	}
	if dra == nil {
		return nil
	}
	fmt.Fprintln(c.stdout)
	return renderDRAInstances(c.stdout, now(), dra)
}

func (c *cli) draDrivers(ctx context.Context) (*dmv1.ListDRADriversResponse, error) {
	cc, err := c.conn(dramanagerSvc)
	if err != nil {
		return nil, err
	}
	resp, err := dmv1.NewDRAServiceClient(cc).ListDRADrivers(ctx, &dmv1.ListDRADriversRequest{})
	if err != nil {
		return nil, c.rpcError(dramanagerSvc, "list DRA drivers", err)
	}
	return resp, nil
}

// writeDriversJSON prints the reconciler's ListDrivers answer with the
// dramanager's DRA drivers beside it, under "draDriverConnections" (each
// a DRADriver of ListDRADrivers; absent when the dramanager did not
// answer).
func writeDriversJSON(w io.Writer, resp *reconcilerv1.ListDriversResponse, dra *dmv1.ListDRADriversResponse) error {
	b, err := protojson.Marshal(resp)
	if err != nil {
		return err
	}
	doc := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	if dra != nil {
		entries := []json.RawMessage{}
		for _, d := range dra.GetDrivers() {
			eb, err := protojson.Marshal(d)
			if err != nil {
				return err
			}
			entries = append(entries, eb)
		}
		if doc["draDriverConnections"], err = json.Marshal(entries); err != nil {
			return err
		}
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}

// renderDRAInstances prints one row per DRA driver instance (a driver with
// none left, one row saying when its slices go).
func renderDRAInstances(w io.Writer, now time.Time, resp *dmv1.ListDRADriversResponse) error {
	if len(resp.GetDrivers()) == 0 {
		_, err := fmt.Fprintln(w, "no DRA driver connections in the dramanager")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "DRA DRIVER\tENDPOINT\tSERVICE\tCONNECTION\tSERVING\tHEALTH\tAGE\tSLICES DELETED\tLAST ERROR")
	for _, d := range resp.GetDrivers() {
		deletion := dash(until(now, d.GetSliceDeletionTime()))
		if len(d.GetInstances()) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\tno instance\t-\t-\t-\t%s\t-\n", d.GetName(), deletion)
			continue
		}
		for _, in := range d.GetInstances() {
			serving := "no"
			if in.GetServing() {
				serving = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.GetName(), in.GetEndpoint(), dash(in.GetService()),
				strings.ToLower(dash(in.GetConnectionState())), serving, dash(in.GetHealthServiceName()),
				age(now, in.GetRegisteredTime()), deletion, dash(in.GetLastError()))
		}
	}
	return tw.Flush()
}

func cmdSlices(ctx context.Context, c *cli, args []string) error {
	var driver string
	return listCommand(ctx, c, "slices", args, dramanagerSvc, func(ctx context.Context, _ *flag.FlagSet) (*dmv1.ListResourceSlicesResponse, error) {
		cc, err := c.conn(dramanagerSvc)
		if err != nil {
			return nil, err
		}
		return dmv1.NewDRAServiceClient(cc).ListResourceSlices(ctx, &dmv1.ListResourceSlicesRequest{DriverName: driver})
	}, renderSlices, func(fs *flag.FlagSet) {
		fs.StringVar(&driver, "driver", "", "only this DRA driver's slices")
	})
}

// renderSlices prints one row per device of each slice (a slice with no
// devices, one row): driver, pool (generation, slice count), slice,
// device, its health (with the driver's message), attributes and capacity.
func renderSlices(w io.Writer, now time.Time, resp *dmv1.ListResourceSlicesResponse) error {
	if len(resp.GetSlices()) == 0 {
		_, err := fmt.Fprintln(w, "no ResourceSlices on this node")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "DRIVER\tPOOL\tGENERATION\tSLICES\tSLICE\tDEVICE\tHEALTH\tATTRIBUTES\tCAPACITY\tAGE")
	for _, s := range resp.GetSlices() {
		p := s.GetPool()
		head := fmt.Sprintf("%s\t%s\t%d\t%d\t%s", s.GetDriver(), dash(p.GetName()), p.GetGeneration(), p.GetResourceSliceCount(), s.GetName())
		if len(s.GetDevices()) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t%s\n", head, age(now, s.GetCreationTime()))
			continue
		}
		for _, d := range s.GetDevices() {
			health := d.GetHealth()
			if m := d.GetHealthMessage(); health != "" && m != "" {
				health += " (" + m + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", head, d.GetName(), dash(health), keyValues(d.GetAttributes()), keyValues(d.GetCapacity()), age(now, s.GetCreationTime()))
		}
	}
	return tw.Flush()
}

// keyValues renders m as k=v pairs in key order; "-" when empty.
func keyValues(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	pairs := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		pairs = append(pairs, k+"="+m[k])
	}
	return strings.Join(pairs, ",")
}
