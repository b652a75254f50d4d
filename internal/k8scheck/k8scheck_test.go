package k8scheck

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const manifests = "../../deploy/kubernetes"

// The parts of the Kubernetes objects the checks read; yaml.v3 ignores the
// rest. KnownFields is off on purpose: this is not a schema.
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		UpdateStrategy struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				MaxUnavailable yaml.Node `yaml:"maxUnavailable"`
				MaxSurge       yaml.Node `yaml:"maxSurge"`
			} `yaml:"rollingUpdate"`
		} `yaml:"updateStrategy"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
	file string
}

type podSpec struct {
	SecurityContext *securityContext `yaml:"securityContext"`
	InitContainers  []container      `yaml:"initContainers"`
	Containers      []container      `yaml:"containers"`
	Volumes         []struct {
		Name     string `yaml:"name"`
		HostPath *struct {
			Path string `yaml:"path"`
			Type string `yaml:"type"`
		} `yaml:"hostPath"`
		EmptyDir *struct{} `yaml:"emptyDir"`
	} `yaml:"volumes"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	RunAsGroup               *int64 `yaml:"runAsGroup"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	Capabilities             *struct {
		Drop []string `yaml:"drop"`
		Add  []string `yaml:"add"`
	} `yaml:"capabilities"`
	SeccompProfile *struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type probe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"`
	} `yaml:"httpGet"`
}

type container struct {
	Name          string `yaml:"name"`
	Image         string `yaml:"image"`
	RestartPolicy string `yaml:"restartPolicy"`
	Env           []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe    *probe           `yaml:"startupProbe"`
	ReadinessProbe  *probe           `yaml:"readinessProbe"`
	LivenessProbe   *probe           `yaml:"livenessProbe"`
	SecurityContext *securityContext `yaml:"securityContext"`
	Resources       struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

func (c *container) env(name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// load parses every document of every manifest.
func load(t *testing.T) []*object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifests, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", manifests, err)
	}
	var objs []*object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for i := 0; ; i++ {
			o := &object{file: filepath.Base(f)}
			if err := dec.Decode(o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: document %d lacks apiVersion, kind or metadata.name", f, i)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// find returns the object of that kind in that file.
func find(t *testing.T, objs []*object, file, kind string) *object {
	t.Helper()
	for _, o := range objs {
		if o.file == file && o.Kind == kind {
			return o
		}
	}
	t.Fatalf("%s: no %s", file, kind)
	return nil
}

// hubContainer returns the container running the listenhub image, among
// the containers and the init containers.
func hubContainer(t *testing.T, o *object) (c *container, init bool) {
	t.Helper()
	spec := &o.Spec.Template.Spec
	for i := range spec.Containers {
		if isHubImage(spec.Containers[i].Image) {
			return &spec.Containers[i], false
		}
	}
	for i := range spec.InitContainers {
		if isHubImage(spec.InitContainers[i].Image) {
			return &spec.InitContainers[i], true
		}
	}
	t.Fatalf("%s: no container runs the listenhub image", o.file)
	return nil, false
}

func isHubImage(image string) bool {
	name, _, _ := strings.Cut(path.Base(image), ":")
	return name == "listenhub"
}

// releaseVersion reads the version constant the binary, the release script
// and the image tag share.
func releaseVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../cmd/listenhub/version.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^const version = "([^"]+)"$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no version constant in cmd/listenhub/version.go")
	}
	return string(m[1])
}

// imageUser reads USER uid:gid from the Containerfile.
func imageUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/container/Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER ([0-9]+):([0-9]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Containerfile has no numeric USER uid:gid")
	}
	uid, _ = strconv.ParseInt(string(m[1]), 10, 64)
	gid, _ = strconv.ParseInt(string(m[2]), 10, 64)
	return uid, gid
}

// effective merges the pod's securityContext under the container's.
func effective(pod, c *securityContext) securityContext {
	var e securityContext
	for _, s := range []*securityContext{pod, c} {
		if s == nil {
			continue
		}
		override(&e.RunAsNonRoot, s.RunAsNonRoot)
		override(&e.RunAsUser, s.RunAsUser)
		override(&e.RunAsGroup, s.RunAsGroup)
		override(&e.AllowPrivilegeEscalation, s.AllowPrivilegeEscalation)
		override(&e.ReadOnlyRootFilesystem, s.ReadOnlyRootFilesystem)
		override(&e.Capabilities, s.Capabilities)
		override(&e.SeccompProfile, s.SeccompProfile)
	}
	return e
}

// override sets *dst to v when v is set.
func override[T any](dst **T, v *T) {
	if v != nil {
		*dst = v
	}
}

// checkHub checks what every hub container needs, wherever it runs, and
// returns its socket path and the volume holding it.
func checkHub(t *testing.T, o *object, c *container) (socket, volume string) {
	t.Helper()
	where := o.file + ": container " + c.Name
	version := releaseVersion(t)
	if _, tag, _ := strings.Cut(path.Base(c.Image), ":"); tag != version {
		t.Errorf("%s: image %s, want the release's tag %s (cmd/listenhub/version.go)", where, c.Image, version)
	}

	// The socket: in a mounted volume.
	socket, ok := c.env("LISTENHUB_SOCKET")
	if !ok || !path.IsAbs(socket) {
		t.Errorf("%s: LISTENHUB_SOCKET %q, want an absolute path", where, socket)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == path.Dir(socket) {
			volume = m.Name
			if m.ReadOnly {
				t.Errorf("%s: the hub's socket directory is mounted read-only: it cannot bind there", where)
			}
		}
	}
	if volume == "" {
		t.Errorf("%s: no volume mounted at %s, the directory of LISTENHUB_SOCKET", where, path.Dir(socket))
	}

	// The database URL from a Secret, never inline.
	url := false
	for _, e := range c.Env {
		if e.Name == "LISTENHUB_DATABASE_URL" {
			url = true
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s: LISTENHUB_DATABASE_URL must come from a secretKeyRef (it holds a password)", where)
			}
		}
	}
	if !url {
		t.Errorf("%s: no LISTENHUB_DATABASE_URL", where)
	}

	// The metrics address, its port and the probes on it.
	addr, ok := c.env("LISTENHUB_METRICS_ADDR")
	if !ok {
		t.Fatalf("%s: no LISTENHUB_METRICS_ADDR: the probes need the metrics server", where)
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil || (host != "" && host != "0.0.0.0" && host != "::") {
		t.Errorf("%s: LISTENHUB_METRICS_ADDR %q: want all of the pod's interfaces (\":PORT\"), the kubelet probes the pod IP", where, addr)
	}
	port, _ := strconv.Atoi(portStr)
	if port != 9064 {
		t.Errorf("%s: metrics port %d, want 9064 (the units', the image's and listenhub status's)", where, port)
	}
	names := map[string]int{}
	declared := false
	for _, p := range c.Ports {
		names[p.Name] = p.ContainerPort
		declared = declared || p.ContainerPort == port
	}
	if !declared {
		t.Errorf("%s: containerPort %d not declared", where, port)
	}
	probePort := func(kind string, p *probe) (string, bool) {
		if p == nil {
			return "", false
		}
		if p.HTTPGet == nil {
			t.Errorf("%s: %s is not an httpGet", where, kind)
			return "", false
		}
		n := p.HTTPGet.Port
		got, err := strconv.Atoi(n.Value)
		if err != nil {
			got = names[n.Value]
		}
		if got != port {
			t.Errorf("%s: %s probes port %q (%d), the metrics server is on %d", where, kind, n.Value, got, port)
		}
		return p.HTTPGet.Path, true
	}
	live, ok := probePort("livenessProbe", c.LivenessProbe)
	if !ok {
		t.Errorf("%s: no livenessProbe", where)
	} else if live == "/healthz" || strings.HasPrefix(live, "/healthz?") {
		t.Errorf("%s: livenessProbe on /healthz would restart the hub, and fail every worker over, whenever Postgres is down", where)
	} else if live != "/status" && !strings.HasPrefix(live, "/workers") && !strings.HasPrefix(live, "/channels") {
		t.Errorf("%s: livenessProbe path %q is not one the hub serves", where, live)
	}
	if p, ok := probePort("readinessProbe", c.ReadinessProbe); ok && p != "/healthz" {
		t.Errorf("%s: readinessProbe path %q, want /healthz", where, p)
	}
	probePort("startupProbe", c.StartupProbe)

	// Not root, nothing to escalate to, nothing to write.
	sc := effective(o.Spec.Template.Spec.SecurityContext, c.SecurityContext)
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: runAsNonRoot is not true", where)
	}
	uid, gid := imageUser(t)
	if sc.RunAsUser == nil || *sc.RunAsUser != uid || sc.RunAsGroup == nil || *sc.RunAsGroup != gid {
		t.Errorf("%s: runAsUser/runAsGroup %v/%v, want the image's %d:%d (it owns the socket directory)", where, sc.RunAsUser, sc.RunAsGroup, uid, gid)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: readOnlyRootFilesystem is not true", where)
	}
	if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 {
		t.Errorf("%s: capabilities: want drop [ALL] and nothing added", where)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("%s: seccompProfile is not RuntimeDefault", where)
	}

	// Requests to schedule by, a memory limit, no CPU limit.
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" {
			t.Errorf("%s: no %s request", where, r)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: no memory limit", where)
	}
	if c.Resources.Limits["cpu"] != "" {
		t.Errorf("%s: a CPU limit throttles the one loop thread: every worker's latency", where)
	}
	return socket, volume
}

// The DaemonSet: one hub per node, its socket in a hostPath directory.
func TestDaemonSet(t *testing.T) {
	objs := load(t)
	ds := find(t, objs, "daemonset.yaml", "DaemonSet")
	c, init := hubContainer(t, ds)
	if init {
		t.Fatalf("daemonset.yaml: the hub is an init container")
	}
	socket, volume := checkHub(t, ds, c)
	if c.ReadinessProbe == nil {
		t.Errorf("daemonset.yaml: no readinessProbe: a rollout would move on before the new hub has LISTENed")
	}
	hostPath := ""
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == volume {
			if v.HostPath == nil {
				t.Fatalf("daemonset.yaml: volume %s is not a hostPath: workers in other pods cannot reach the socket", volume)
			}
			hostPath = v.HostPath.Path
			if v.HostPath.Type != "DirectoryOrCreate" && v.HostPath.Type != "Directory" {
				t.Errorf("daemonset.yaml: hostPath type %q, want DirectoryOrCreate or Directory", v.HostPath.Type)
			}
		}
	}
	if hostPath != path.Dir(socket) {
		t.Errorf("daemonset.yaml: hostPath %q, want the socket's directory %q on the node too (workers use that path)", hostPath, path.Dir(socket))
	}
	// Two hubs cannot serve one socket path: no surge.
	u := ds.Spec.UpdateStrategy
	if u.Type != "RollingUpdate" || u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable.Kind == 0 {
		t.Errorf("daemonset.yaml: want a RollingUpdate with maxUnavailable")
	} else if s := u.RollingUpdate.MaxSurge; s.Kind != 0 && s.Value != "0" {
		t.Errorf("daemonset.yaml: maxSurge %s: a second hub on the node cannot take the socket path", s.Value)
	}
	if sel, lab := ds.Spec.Selector.MatchLabels, ds.Spec.Template.Metadata.Labels; len(sel) == 0 || !subset(sel, lab) {
		t.Errorf("daemonset.yaml: selector %v does not match the template's labels %v", sel, lab)
	}
	// Any init container that prepares the directory mounts the same volume.
	for _, ic := range ds.Spec.Template.Spec.InitContainers {
		mounted := false
		for _, m := range ic.VolumeMounts {
			mounted = mounted || m.Name == volume && m.MountPath == path.Dir(socket)
		}
		if !mounted {
			t.Errorf("daemonset.yaml: init container %s does not mount the socket directory", ic.Name)
		}
	}

	// The workers' side: the same node directory, the same socket path.
	w := find(t, objs, "worker.yaml", "Deployment")
	checkWorker(t, w, socket, func(name string) bool {
		for _, v := range w.Spec.Template.Spec.Volumes {
			if v.Name == name {
				return v.HostPath != nil && v.HostPath.Path == hostPath
			}
		}
		return false
	})
}

// The sidecar: a hub in the pod, its socket in an emptyDir.
func TestSidecar(t *testing.T) {
	objs := load(t)
	d := find(t, objs, "sidecar.yaml", "Deployment")
	c, init := hubContainer(t, d)
	if !init || c.RestartPolicy != "Always" {
		t.Errorf("sidecar.yaml: want the hub as a native sidecar (an init container with restartPolicy: Always), so it starts before the application and stops after it")
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path == "/healthz" {
		t.Errorf("sidecar.yaml: readiness on /healthz takes the application out of its Service whenever Postgres is down")
	}
	socket, volume := checkHub(t, d, c)
	checkWorker(t, d, socket, func(name string) bool {
		if name != volume {
			return false
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == name {
				return v.EmptyDir != nil
			}
		}
		return false
	})
}

// checkWorker: the application containers of o mount a volume sameVolume
// accepts at the socket's directory, read-only, with LISTENHUB_SOCKET set
// to the same path, and run as a uid the hub admits.
func checkWorker(t *testing.T, o *object, socket string, sameVolume func(string) bool) {
	t.Helper()
	apps := 0
	for i := range o.Spec.Template.Spec.Containers {
		c := &o.Spec.Template.Spec.Containers[i]
		if isHubImage(c.Image) {
			continue
		}
		apps++
		where := o.file + ": container " + c.Name
		if got, _ := c.env("LISTENHUB_SOCKET"); got != socket {
			t.Errorf("%s: LISTENHUB_SOCKET %q, the hub serves %q", where, got, socket)
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			if m.MountPath == path.Dir(socket) && sameVolume(m.Name) {
				mounted = true
				if !m.ReadOnly {
					t.Errorf("%s: mount the socket directory readOnly (connecting writes nothing)", where)
				}
			}
		}
		if !mounted {
			t.Errorf("%s: the hub's socket directory is not mounted at %s", where, path.Dir(socket))
		}
		sc := effective(o.Spec.Template.Spec.SecurityContext, c.SecurityContext)
		uid, _ := imageUser(t)
		if sc.RunAsUser == nil || *sc.RunAsUser != uid {
			t.Errorf("%s: runAsUser %v: the hub admits its own uid %d and root (socket 0600); run the workers as %d or list theirs in LISTENHUB_ALLOW_UID", where, sc.RunAsUser, uid, uid)
		}
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: runAsNonRoot is not true", where)
		}
	}
	if apps == 0 {
		t.Errorf("%s: no application container", o.file)
	}
}

func subset(sub, of map[string]string) bool {
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return true
}
