// nri-go-peer: the benchmark's reference NRI plugin, on containerd/nri 0.6.1's stub. It makes
// the BestEffort adjustments runtime-hooks' default plugins make for a pod labelled
// koordinator.sh/qosClass=BE with Koordinator's extended-resource-spec annotation:
//
//   - RunPodSandbox: the pod cgroup's cpu.cfs_quota_us (sum of the batch-cpu limits) and
//     cpu.shares (sum of the batch-cpu requests * 1024 / 1000), cgroup v1 cgroupfs;
//   - CreateContainer: the container's CPU shares, quota and period from its batch-cpu;
//   - PostStartContainer: oom_score_adj 1000 for the container's process, if lower.
//
// It logs nothing on the event path. With -probe FILE it is instead a probe: it only notes the
// wall-clock time each of those events reaches it (in memory; written to FILE at SIGTERM or when
// the runtime closes the connection), for the benchmark to place one probe before and one after
// the plugin under test. Built offline by bench/go_peer.py.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

const (
	qosLabel    = "koordinator.sh/qosClass"
	specKey     = "node.koordinator.sh/extended-resource-spec"
	batchCPU    = "kubernetes.io/batch-cpu"
	period      = 100000
	beOOMScore  = 1000
	minShares   = 2
	maxShares   = 262144
)

type containerSpec struct {
	Requests map[string]string `json:"requests"`
	Limits   map[string]string `json:"limits"`
}

type resourceSpec struct {
	Containers map[string]containerSpec `json:"containers"`
}

type peer struct {
	cgroupRoot string
}

type probe struct {
	mu    sync.Mutex
	lines []string
}

func (p *probe) note(event string, pod *api.PodSandbox) {
	now := time.Now().UnixNano()
	p.mu.Lock()
	p.lines = append(p.lines, fmt.Sprintf("%s %s %d\n", event, pod.GetUid(), now))
	p.mu.Unlock()
}

func (p *probe) dump(path string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = os.WriteFile(path, []byte(strings.Join(p.lines, "")), 0o644)
}

func (p *probe) Configure(_ context.Context, _, _, _ string) (api.EventMask, error) {
	return api.ParseEventMask("RunPodSandbox,CreateContainer,PostStartContainer")
}

func (p *probe) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.note("RunPodSandbox", pod)
	return nil
}

func (p *probe) CreateContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.note("CreateContainer", pod)
	return nil, nil, nil
}

func (p *probe) PostStartContainer(_ context.Context, pod *api.PodSandbox, _ *api.Container) error {
	p.note("PostStartContainer", pod)
	return nil
}

func milli(values map[string]string) int64 {
	v, err := strconv.ParseInt(values[batchCPU], 10, 64)
	if err != nil {
		return 0
	}
	return v
}

func clampShares(m int64) uint64 {
	s := m * 1024 / 1000
	if s < minShares {
		s = minShares
	}
	if s > maxShares {
		s = maxShares
	}
	return uint64(s)
}

func spec(pod *api.PodSandbox) (*resourceSpec, bool) {
	if pod.GetLabels()[qosLabel] != "BE" {
		return nil, false
	}
	text, ok := pod.GetAnnotations()[specKey]
	if !ok {
		return nil, false
	}
	var s resourceSpec
	if json.Unmarshal([]byte(text), &s) != nil {
		return nil, false
	}
	return &s, true
}

func (p *peer) Configure(_ context.Context, _, _, _ string) (api.EventMask, error) {
	return api.ParseEventMask("RunPodSandbox,CreateContainer,PostStartContainer")
}

func (p *peer) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	s, ok := spec(pod)
	if !ok {
		return nil
	}
	var requests, limits int64
	for _, c := range s.Containers {
		requests += milli(c.Requests)
		limits += milli(c.Limits)
	}
	dir := filepath.Join(p.cgroupRoot, "cpu", filepath.Clean("/"+pod.GetLinux().GetCgroupParent()))
	if limits > 0 {
		if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(limits*period/1000, 10)), 0o644); err != nil {
			return err
		}
	}
	if requests > 0 {
		return os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(strconv.FormatUint(clampShares(requests), 10)), 0o644)
	}
	return nil
}

func (p *peer) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	s, ok := spec(pod)
	if !ok {
		return nil, nil, nil
	}
	c, ok := s.Containers[ctr.GetName()]
	if !ok {
		return nil, nil, nil
	}
	adjust := &api.ContainerAdjustment{}
	if m := milli(c.Requests); m > 0 {
		adjust.SetLinuxCPUShares(clampShares(m))
	}
	if m := milli(c.Limits); m > 0 {
		adjust.SetLinuxCPUQuota(m * period / 1000)
		adjust.SetLinuxCPUPeriod(period)
	}
	return adjust, nil, nil
}

func (p *peer) PostStartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if pod.GetLabels()[qosLabel] != "BE" || ctr.GetPid() == 0 {
		return nil
	}
	path := fmt.Sprintf("/proc/%d/oom_score_adj", ctr.GetPid())
	current, err := os.ReadFile(path)
	if err != nil {
		return nil // gone already
	}
	if v, err := strconv.Atoi(strings.TrimSpace(string(current))); err == nil && v >= beOOMScore {
		return nil
	}
	return os.WriteFile(path, []byte(strconv.Itoa(beOOMScore)), 0o644)
}

func main() {
	socket := flag.String("socket", "/var/run/nri/nri.sock", "the runtime's NRI socket")
	name := flag.String("name", "go-peer", "plugin name")
	index := flag.String("index", "50", "plugin index")
	cgroupRoot := flag.String("cgroup-root", "/sys/fs/cgroup", "cgroup v1 mount root")
	probeOut := flag.String("probe", "", "be a probe writing its event times here")
	flag.Parse()
	var plugin interface{} = &peer{cgroupRoot: *cgroupRoot}
	if *probeOut != "" {
		pr := &probe{}
		plugin = pr
		defer pr.dump(*probeOut)
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
		go func() {
			<-signals
			pr.dump(*probeOut)
			os.Exit(0)
		}()
	}
	s, err := stub.New(plugin, stub.WithSocketPath(*socket), stub.WithPluginName(*name),
		stub.WithPluginIdx(*index))
	if err != nil {
		fmt.Fprintln(os.Stderr, "nri-go-peer:", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "nri-go-peer:", err)
	}
}
