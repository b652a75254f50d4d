// Package k8scheck holds the test of deploy/kubernetes: it parses the
// manifests with a YAML library and checks the fields a deployment depends
// on (the socket's volume and path on both sides, the probes, the
// securityContext, the resources, the update strategy, the image's version
// and user). It is a module of its own so that the YAML library never
// becomes a dependency of the main module.
package k8scheck
