package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const healthcheckArgs = "watcher|reconciler|devicemanager|dramanager|jaeger"

// cmdHealthcheck checks that one part of the stack serves: a service's gRPC
// health on its API, or Jaeger's query API (--jaeger-url). It prints
// nothing when it does and exits 0; otherwise it says why and exits 1. The
// compose stack's Jaeger image (FROM scratch, no shell) runs it.
func cmdHealthcheck(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("healthcheck", healthcheckArgs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("say what to check: %s", strings.ReplaceAll(healthcheckArgs, "|", ", "))
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	var svc service
	switch pos[0] {
	case "jaeger":
		return c.jaegerHealthy(cctx)
	case "watcher":
		svc = watcherSvc
	case "reconciler":
		svc = reconcilerSvc
	case "devicemanager":
		svc = devicemanagerSvc
	case "dramanager":
		svc = dramanagerSvc
	default:
		return usagef("cannot check %q: want %s", pos[0], strings.ReplaceAll(healthcheckArgs, "|", ", "))
	}
	cc, err := c.conn(svc)
	if err != nil {
		return err
	}
	resp, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return c.rpcError(svc, "health check", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("the %s at %s is %s", svc.name, svc.addr(&c.g), resp.GetStatus())
	}
	return nil
}

// jaegerHealthy asks Jaeger's query API for its services: a 200 with JSON
// means it serves.
func (c *cli) jaegerHealthy(ctx context.Context) error {
	u := strings.TrimRight(c.g.jaegerURL, "/") + "/api/services"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return usagef("--jaeger-url %q: %v", c.g.jaegerURL, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach Jaeger at %s: %v (--jaeger-url)", c.g.jaegerURL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(strings.TrimSpace(string(body)), "{") {
		return fmt.Errorf("jaeger at %s: GET /api/services answered %s — is --jaeger-url the query service?", c.g.jaegerURL, resp.Status)
	}
	return nil
}
