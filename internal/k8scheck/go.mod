module github.com/listenhub/listenhub/internal/k8scheck

go 1.26.0

require gopkg.in/yaml.v3 v3.0.1
